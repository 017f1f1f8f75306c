"""A randomly initialised model of a real architecture's shape, for measuring the production path
(vLLM actor, DeepSpeed learner, weight broadcast) at real size on a machine with no model hub.

Qwen2.5-0.5B's config (24 layers, hidden 896, 14 query / 2 key-value heads, MLP 4864, vocabulary
151,936, tied embeddings: 494M parameters) written from its numbers, with random weights, and the
embedded character tokenizer padded with filler tokens to the same 151,936 entries. The padding
keeps the token-id bound the codec enforces (`len(tokenizer)`) equal to the model's vocabulary:
a random model samples every id below 151,936, and each must be a valid token on both sides.
(A real Qwen2.5 tokenizer has 151,665 entries against the same 151,936 rows.)

    python -c "from rlvr.real_shape import ensure_real_shape; print(ensure_real_shape())"
    rlvr bench realshape            # a few RL steps on it (rlvr/bench/realshape.py)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tasks.tiny_model import build_tokenizer

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)
"""Qwen/Qwen2.5-0.5B's config.json, the fields that set its shape."""
NAME = "qwen2.5-0.5b-shape"
DONE = "COMPLETE"


def build_real_shape(path: str | Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                     **shape) -> Path:
    """Write the model (random weights in `dtype`) and its padded tokenizer to `path`. `shape`
    overrides fields of QWEN25_05B (tests use a small vocabulary and few layers)."""
    path = Path(path)
    fields = {**QWEN25_05B, **shape}
    tok = build_tokenizer(vocab_size=fields["vocab_size"])
    config = Qwen2Config(**fields, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def ensure_real_shape(cache_dir: str | Path = ".cache/rlvr", log=print) -> Path:
    """The real-shape model under `cache_dir`, built once (about 20 s and 1 GB in bf16)."""
    path = Path(cache_dir) / NAME
    if (path / DONE).exists():
        return path
    log(f"building a random {NAME} model in {path}")
    tmp = path.with_name(f"{NAME}.tmp-{os.getpid()}")
    build_real_shape(tmp)
    (tmp / DONE).touch()
    if path.exists():  # a partial build from an interrupted run
        import shutil
        shutil.rmtree(path)
    tmp.rename(path)
    return path
