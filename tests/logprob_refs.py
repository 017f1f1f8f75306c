"""Reference log-probs for the engine tests, from plain HF forward passes (no engine code)."""

from __future__ import annotations

import torch


def full_forward_logp(model, prompt: list[int], response: list[int], temperature: float = 1.0):
    """log softmax(logits / T) of each response token, from one uncached forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]


def kept_kv_logp(old, new, prompt: list[int], response: list[int], kept: int):
    """log softmax of response[kept + 1:] under `new`, attending to the KV cache that `old`
    computed over prompt + response[:kept]: what `continue` leaves in an engine's rows when the
    weights change after response[kept] was sampled and before it was fed back in."""
    with torch.no_grad():
        past = old(input_ids=torch.tensor([prompt + response[:kept]]),
                   use_cache=True).past_key_values
        logits = new(input_ids=torch.tensor([response[kept:-1]]), past_key_values=past).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return logp.gather(-1, torch.tensor(response[kept + 1:])[:, None])[:, 0]
