"""From scored groups to training rows and padded tensors, and how rows are cut into batches.

A `Row` is one response that enters the loss, with its group advantage already computed. `pack`
right-pads prompt+response rows into tensors aligned to *targets*: position t of every (B, T-1)
tensor describes token t+1, the token predicted from logits at position t.

Rows are cut twice (docs/ALGORITHMS.md 1.4): a learner step's batch into optimizer mini-batches of
whole groups (`mini_batches`), and each rank's share of a mini-batch into forward/backward
micro-batches bounded by a count of sequences and a budget of padded tokens (`micro_batches`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    prompt: list[int]
    response: list[int]
    behav_logp: list[float]  # per response token, from the actor's engine
    adv: float
    policy_version: int  # weights that sampled it
    scale: float = 1.0  # staleness down-weighting (1 unless stale_policy = downweight)
    group_id: str = ""


def tokens(row: Row) -> int:
    """Prompt + response tokens of a row."""
    return len(row.prompt) + len(row.response)


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # (B, T) right-padded prompt+response
    attention: torch.Tensor  # (B, T)
    targets: torch.Tensor  # (B, T-1) = input_ids[:, 1:]
    mask: torch.Tensor  # (B, T-1) float, 1 on response-token targets
    behav_logp: torch.Tensor  # (B, T-1) behaviour log-probs on response targets, 0 elsewhere
    adv: torch.Tensor  # (B,)
    scale: torch.Tensor  # (B,)

    def to(self, device: torch.device | str) -> Packed:
        """The same tensors on `device` (the model's)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def pack(rows: list[Row], pad_id: int) -> Packed:
    width = max(tokens(r) for r in rows)
    B = len(rows)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width - 1))
    for b, r in enumerate(rows):
        p, n = len(r.prompt), len(r.response)
        ids[b, :p + n] = torch.tensor(r.prompt + r.response)
        attention[b, :p + n] = 1
        mask[b, p - 1:p - 1 + n] = 1.0  # logits at p-1 predict the first response token
    behav = on_responses(rows, [torch.tensor(r.behav_logp) for r in rows], width - 1)
    return Packed(ids, attention, ids[:, 1:], mask, behav,
                  torch.tensor([r.adv for r in rows], dtype=torch.float32),
                  torch.tensor([r.scale for r in rows], dtype=torch.float32))


def on_responses(rows: Sequence[Row], values: Sequence[torch.Tensor], width: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Per-response-token values (one (n_i,) vector per row) placed on the targets: (B, width),
    0 off the responses. The inverse of `of_responses`."""
    out = torch.zeros((len(rows), width), device=device)
    for b, (r, v) in enumerate(zip(rows, values)):
        p = len(r.prompt)
        out[b, p - 1:p - 1 + len(r.response)] = v.to(device=device, dtype=out.dtype)
    return out


def of_responses(rows: Sequence[Row], values: torch.Tensor) -> list[torch.Tensor]:
    """Each row's response-token values (n_i,) out of a (B, T-1) target-aligned tensor."""
    return [values[b, len(r.prompt) - 1:tokens(r) - 1] for b, r in enumerate(rows)]


def mini_batches(group_ids: Sequence[str], count: int,
                 order_seed: str | None = None) -> list[list[int]]:
    """Row indices of `count` optimizer mini-batches of whole groups, with as equal a number of
    groups as can be (DAPO: 32 prompts each). Groups go in the order of their first row, or
    shuffled by `order_seed` (a string: the same order in every process). A row without a group
    id is a group of its own. A mini-batch is empty when there are fewer groups than
    mini-batches."""
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g or f"\0{i}", []).append(i)
    units = list(groups.values())
    if order_seed is not None:
        random.Random(order_seed).shuffle(units)
    base, extra = divmod(len(units), count)
    out, at = [], 0
    for k in range(count):
        size = base + (k < extra)
        out.append([i for unit in units[at:at + size] for i in unit])
        at += size
    return out


def micro_batches(items: Sequence[T], length: Callable[[T], int], max_seqs: int,
                  max_tokens: int | None = None) -> list[list[T]]:
    """Items sorted by length, cut into micro-batches of at most `max_seqs` items and at most
    `max_tokens` padded tokens (items x the longest one). An item longer than `max_tokens` gets
    a micro-batch of its own. Sorting keeps padding small; the loss does not depend on the
    split (step-global denominators, docs/ALGORITHMS.md 1.4)."""
    batches: list[list[T]] = []
    current: list[T] = []
    for item in sorted(items, key=length):
        n = length(item)  # the longest so far: items come in increasing length
        fits = len(current) < max_seqs and (max_tokens is None
                                            or (len(current) + 1) * n <= max_tokens)
        if current and not fits:
            batches.append(current)
            current = []
        current.append(item)
    return batches + ([current] if current else [])
