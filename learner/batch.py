"""From scored groups to training rows and padded tensors.

A `Row` is one response that enters the loss, with its group advantage already computed. `pack`
right-pads prompt+response rows into tensors aligned to *targets*: position t of every (B, T-1)
tensor describes token t+1, the token predicted from logits at position t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Row:
    prompt: list[int]
    response: list[int]
    behav_logp: list[float]  # per response token, from the actor's engine
    adv: float
    policy_version: int  # weights that sampled it
    scale: float = 1.0  # staleness down-weighting (1 unless stale_policy = downweight)
    group_id: str = ""


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # (B, T) right-padded prompt+response
    attention: torch.Tensor  # (B, T)
    targets: torch.Tensor  # (B, T-1) = input_ids[:, 1:]
    mask: torch.Tensor  # (B, T-1) float, 1 on response-token targets
    behav_logp: torch.Tensor  # (B, T-1) behaviour log-probs on response targets, 0 elsewhere
    adv: torch.Tensor  # (B,)
    scale: torch.Tensor  # (B,)


def pack(rows: list[Row], pad_id: int) -> Packed:
    width = max(len(r.prompt) + len(r.response) for r in rows)
    B = len(rows)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width - 1))
    behav = torch.zeros((B, width - 1))
    for b, r in enumerate(rows):
        p, n = len(r.prompt), len(r.response)
        ids[b, :p + n] = torch.tensor(r.prompt + r.response)
        attention[b, :p + n] = 1
        mask[b, p - 1:p - 1 + n] = 1.0  # logits at p-1 predict the first response token
        behav[b, p - 1:p - 1 + n] = torch.tensor(r.behav_logp)
    return Packed(ids, attention, ids[:, 1:], mask, behav,
                  torch.tensor([r.adv for r in rows], dtype=torch.float32),
                  torch.tensor([r.scale for r in rows], dtype=torch.float32))


def micro_batches(rows: list[Row], size: int) -> list[list[Row]]:
    # sort by length so each micro-batch pads little; the loss is invariant to the split
    ordered = sorted(rows, key=lambda r: len(r.prompt) + len(r.response))
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]
