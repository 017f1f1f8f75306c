"""The policy's per-token log-probs at the sampling temperature, without the (B, T, V) logits.

What: `token_logp` runs the model body once, takes the final hidden states of the loss positions
only (response targets, packed.mask != 0) and applies the LM head and the log-softmax to them a
chunk of tokens at a time, gathering the target token's log-prob (and, when asked, the
entropy). Each chunk runs under activation checkpointing, so the backward pass recomputes one
chunk's logits at a time instead of keeping them all: the head's memory is one chunk's logits
(`CHUNK_LOGITS_BYTES`), whatever the micro-batch's length. `full_logits_logp` is the plain
version (the whole micro-batch's float32 logits and their log-softmax: 15 GB for 4 x 6k tokens
and Qwen's 151,936-token vocabulary) that tests check the chunked one against and `rlvr bench
memory` compares it with.
Why the temperature: the actors sample from softmax(logits / T) and report those log-probs
(tasks/hf_engine.py, actors/engines/vllm.py processed_logprobs); the ratio and the behaviour
weight compare like with like only when the learner divides by the same T (docs/ALGORITHMS.md 8.3).
How: the body's output is taken from the model's own forward (output_hidden_states, no logits
kept) while gradients are on, so a DeepSpeed engine sees the tensor the loss flows through; in
no-grad passes (proximal and reference log-probs) the body is called directly and no layer's
hidden states are held.

Run the tests with: python -m pytest tests/test_logprobs.py
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from learner.batch import Packed
from learner.losses import entropy_from_logits

CHUNK_LOGITS_BYTES = 128 << 20
"""Float32 logits per chunk: 220 tokens of a 151,936-token vocabulary, the whole micro-batch of
the tiny model's 101. A chunk holds a few such buffers at once (logits, exp, gradient)."""


def chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk so that one chunk's float32 logits take CHUNK_LOGITS_BYTES."""
    return max(1, CHUNK_LOGITS_BYTES // (4 * vocab_size))


def causal_lm(model):
    """The Hugging Face causal LM inside a DeepSpeed engine (or the model itself)."""
    return getattr(model, "module", model)


def model_device(model) -> torch.device:
    """Where the inputs go: a DeepSpeed engine's (or HF model's) device; under ZeRO-3 the
    parameters' own tensors are empty shards and may sit elsewhere (CPU offload)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(causal_lm(model).parameters()).device


def final_hidden(model, packed: Packed) -> torch.Tensor:
    """Final (normed) hidden states (B, T, H), the LM head's input."""
    lm = causal_lm(model)
    if torch.is_grad_enabled():  # through the engine's forward: DeepSpeed hooks its outputs
        none = torch.empty(0, dtype=torch.long, device=packed.input_ids.device)
        out = model(input_ids=packed.input_ids, attention_mask=packed.attention,
                    logits_to_keep=none, output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1]
    body = lm.get_decoder()
    return body(input_ids=packed.input_ids, attention_mask=packed.attention,
                use_cache=False).last_hidden_state


def _head_terms(hidden: torch.Tensor, targets: torch.Tensor, head, temperature: float,
                entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(target) (n,) and the entropy (n,) (zeros unless `entropy`) of one chunk of
    hidden states (n, H), at `temperature`."""
    logits = head(hidden).float()  # (n, V)
    if temperature != 1.0:
        logits = logits.div_(temperature)  # in place: the matmul keeps its inputs, not this
    logz = torch.logsumexp(logits, dim=-1)  # (n,)
    logp = logits.gather(-1, targets[:, None])[:, 0] - logz
    if not entropy:
        return logp, torch.zeros_like(logp)
    if entropy_grad and torch.is_grad_enabled():
        return logp, entropy_from_logits(logits)
    with torch.no_grad():  # the metric alone: H = log Z - sum_v p_v z_v with one (n, V) buffer
        p_z = torch.softmax(logits, dim=-1).mul_(logits).nan_to_num_(nan=0.0)  # 0 * -inf = 0
        return logp, logz.detach() - p_z.sum(dim=-1)


def token_logp(model, packed: Packed, temperature: float = 1.0, entropy: bool = False,
               entropy_grad: bool = False, chunk: int | None = None, recompute: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi_theta of every response target (B, T-1) under softmax(logits / temperature), 0 off
    the responses, and the entropy there (B, T-1) when `entropy` (else None); the entropy
    carries gradient only with `entropy_grad`. `packed` must be on the model's device.
    chunk: tokens per LM-head chunk (default: chunk_tokens of the vocabulary); recompute=False
    keeps every chunk's logits for the backward instead (`rlvr bench memory` shows the cost)."""
    lm = causal_lm(model)
    if getattr(lm.config, "final_logit_softcapping", None):
        raise ValueError("models with final_logit_softcapping are not supported by the chunked "
                         "log-probs (learner/logprobs.py)")
    sel = packed.mask != 0  # (B, T-1)
    hidden = final_hidden(model, packed)[:, :-1][sel]  # (N, H) loss positions only
    targets = packed.targets[sel]  # (N,)
    head = lm.get_output_embeddings()
    n = chunk or chunk_tokens(lm.config.vocab_size)
    logps, ents = [], []
    for at in range(0, max(len(targets), 1), n):
        args = (hidden[at:at + n], targets[at:at + n], head, temperature, entropy, entropy_grad)
        if recompute and torch.is_grad_enabled():  # the backward recomputes this chunk alone
            lp, ent = checkpoint(_head_terms, *args, use_reentrant=False)
        else:
            lp, ent = _head_terms(*args)
        logps.append(lp)
        ents.append(ent)
    zeros = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device)
    logp = zeros.masked_scatter(sel, torch.cat(logps))
    return logp, zeros.masked_scatter(sel, torch.cat(ents)) if entropy else None


def full_logits_logp(model, packed: Packed, temperature: float = 1.0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain version: log pi of every target (B, T-1) and the float32 logits / T it came
    from (B, T-1, V). Memory grows with B x T x V; for tests and `rlvr bench memory`."""
    logits = model(input_ids=packed.input_ids, attention_mask=packed.attention).logits[:, :-1]
    logits = logits.float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, packed.targets[..., None])[..., 0]
    return logp, logits
