"""The embedded default model: a tiny Qwen2 with a character-level fast tokenizer.

No model hub is reachable from the machines this project must run on, so the default model is
built here from a standard Hugging Face architecture (`Qwen2ForCausalLM`) and a real `tokenizers`
fast tokenizer with a chat template. Both are written with `save_pretrained` and read back with
`from_pretrained`, so everything downstream takes exactly the code path a real checkpoint takes.

    python -c "from tasks.tiny_model import build_tiny; build_tiny('/tmp/tiny')"
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, EOS, USER, ASSISTANT = "<|pad|>", "<|eos|>", "<|user|>", "<|assistant|>"
BOXED = "\\boxed{"  # one token: the answer format is learnt at once, the digits are what counts

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + EOS + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def build_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII, with chat special tokens. `vocab_size`
    pads the vocabulary with filler tokens `<|f0|>`, `<|f1|>`, ... (never produced by encoding,
    decoded as themselves) to exactly that many entries, for a model of a real vocabulary's
    shape (rlvr/real_shape.py)."""
    specials = [PAD, EOS, USER, ASSISTANT, "<|unk|>"]
    chars = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
    fillers = [] if vocab_size is None else \
        [f"<|f{i}|>" for i in range(vocab_size - len(specials) - len(chars) - 1)]  # 1: BOXED
    vocab = {tok: i for i, tok in enumerate(specials + chars + fillers)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token="<|unk|>",
        additional_special_tokens=[USER, ASSISTANT],
    )
    tok.add_tokens([BOXED])
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"  # generation pads on the left so every row ends at the prompt
    if vocab_size is not None and len(tok) != vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is below the {len(tok) - len(fillers)} "
                         "tokens the tokenizer needs")
    return tok


def load_tokenizer(path: str | Path):
    """A model folder's tokenizer, as saved. `AutoTokenizer` would pick the class from the
    model's type instead (Qwen2Tokenizer for the tiny model's Qwen2 config), which rebuilds the
    pre-tokenizer around the vocabulary and drops every space of a text it encodes: a prompt
    "def f(x):" reached the model as "deff(x):", which the warm start never showed it. A
    tokenizer saved as a plain `tokenizers` one (the tiny model's) is therefore loaded as one;
    any other goes through AutoTokenizer."""
    import json

    from transformers import AutoTokenizer

    saved = Path(path) / "tokenizer_config.json"
    if saved.exists() and json.loads(saved.read_text()).get("tokenizer_class") in (
            "TokenizersBackend", "PreTrainedTokenizerFast"):
        tok = PreTrainedTokenizerFast.from_pretrained(path)
        if tok.backend_tokenizer.decoder is None:  # one character a token: join them as they are
            tok.backend_tokenizer.decoder = decoders.Fuse()
        return tok
    return AutoTokenizer.from_pretrained(path)


def build_model(tokenizer: PreTrainedTokenizerFast, hidden: int = 128, layers: int = 4,
                heads: int = 4, ffn: int = 512, seed: int = 0,
                max_positions: int = 256) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=ffn,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def build_tiny(path: str | Path, **model_kw) -> Path:
    """Write a randomly initialised tiny model and its tokenizer to `path`."""
    path = Path(path)
    tok = build_tokenizer()
    model = build_model(tok, **model_kw)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
