"""The KV cache of a changing set of sequences, for the HF engine's decode loop (engines/hf.py).

Rows are sequences; every layer's keys and values are (B, H, L, D) with each row's real tokens
right-aligned and its left padding masked out by `mask` (B, L). Joining prefilled rows pads the
narrower side on the left; dropping rows trims the leading columns no row uses any more. A row's
position ids count its own real tokens, so padding never changes what a row computes.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class KVRows:
    def __init__(self, cache: DynamicCache | None = None, mask: torch.Tensor | None = None):
        self.cache = cache
        self.mask = mask  # (B, L) 1 where the column holds one of the row's tokens

    @staticmethod
    def prefill(model, prompts: list[list[int]], pad_id: int) -> tuple["KVRows", torch.Tensor]:
        """Run `prompts` through `model`; returns their rows and last-position logits (n, V)."""
        device = next(model.parameters()).device
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)                          # (n, W)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        return KVRows(out.past_key_values, mask), out.logits[:, -1]

    def decode(self, model, last: torch.Tensor) -> torch.Tensor:
        """Feed each row's last sampled token (B,); returns the next logits (B, V)."""
        mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)  # (B, L + 1)
        positions = self.mask.sum(-1, keepdim=True)                             # (B, 1)
        out = model(input_ids=last[:, None], attention_mask=mask, position_ids=positions,
                    past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.cache, self.mask = out.past_key_values, mask
        return out.logits[:, -1]

    def join(self, other: "KVRows") -> None:
        """Append `other`'s rows after this one's."""
        if self.cache is None:
            self.cache, self.mask = other.cache, other.mask
            return
        width = max(self.mask.shape[1], other.mask.shape[1])
        layers = [(torch.cat([_pad_left(a.keys, width), _pad_left(b.keys, width)]),
                   torch.cat([_pad_left(a.values, width), _pad_left(b.values, width)]))
                  for a, b in zip(self.cache.layers, other.cache.layers)]
        self.cache = DynamicCache(ddp_cache_data=layers)
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(other.mask, width)])

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in that order) and trim the columns none of them uses."""
        if not keep:
            self.cache = self.mask = None
            return
        idx = torch.tensor(keep, device=self.mask.device)
        mask = self.mask[idx]
        first = int(mask.any(0).nonzero()[0])  # leading columns that are padding in every row
        self.mask = mask[:, first:]
        self.cache = DynamicCache(ddp_cache_data=[
            (layer.keys[idx, :, first:], layer.values[idx, :, first:])
            for layer in self.cache.layers])


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the sequence dimension of a (B, L) mask or (B, H, L, D) key/value on the left."""
    dim = 1 if t.dim() == 2 else 2
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
