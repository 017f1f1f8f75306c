"""The KV cache of a changing set of sequences, for the HF engine's decode loop
(tasks/hf_engine.py), kept in place: rows live in slots of preallocated buffers and nothing is
copied when one joins or leaves.

Every layer's keys and values live in (S, H, C, D) buffers: S slots, C columns. All live rows
share one write column, `end`: a decode step writes every slot's new key and value at column
`end`, in place, and moves it on. A row's tokens are right-aligned to `end`, from its own `start`;
the columns before it are masked out, and its positions count its own tokens only, so what a row
computes never depends on the others. A new row is prefilled alone (with the others joining in
the same step) and its prompt's keys and values are written into a free slot, ending at `end`.
The model sees columns `lo` (the oldest live row's start) to `end`, a view.

Copies happen only when the buffers run out of columns (the live window moves to the front, or
the buffers double) or when half the slots in use are free (live slots move to the front).
transformers' DynamicCache instead concatenates a copy of the whole cache every decode step, and
the engine's rows that come and go copied it twice more (scripts/hf_engine_rows.py under
cProfile: copies were 9 s of a 13 s steady run of 128 rows).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class _SlotLayer(DynamicLayer):
    """One model layer's view of the slots: what the model's attention reads and writes."""

    def __init__(self, slots: "KVSlots", index: int):
        super().__init__()
        self.slots, self.index, self.is_initialized = slots, index, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        s = self.slots
        k, v = s.keys[self.index], s.values[self.index]
        n = key_states.shape[0]
        k[:n, :, s.end] = key_states[:, :, 0]
        v[:n, :, s.end] = value_states[:, :, 0]
        return k[:n, :, s.lo:s.end + 1], v[:n, :, s.lo:s.end + 1]

    def get_seq_length(self) -> int:
        return self.slots.end - self.slots.lo


class KVSlots:
    def __init__(self):
        self.keys: list[torch.Tensor] = []  # per layer (S, H, C, D)
        self.values: list[torch.Tensor] = []
        self.start: torch.Tensor | None = None  # (S,) first column of each slot's row
        self.live: list[bool] = []  # per slot in use (len = slots in use, up to the last live)
        self.lo = self.end = 0

    @property
    def used(self) -> int:
        """Slots the decode passes cover (free ones among them decode a throwaway token)."""
        return len(self.live)

    def free_slots(self, count: int) -> list[int]:
        """`count` slots for new rows: the free ones first, then new ones past the used ones."""
        free = [i for i, alive in enumerate(self.live) if not alive][:count]
        return free + list(range(self.used, self.used + count - len(free)))

    # -- rows in ------------------------------------------------------------------------------
    def add(self, model, prompts: list[list[int]], slots: list[int],
            pad_id: int) -> torch.Tensor:
        """Prefill `prompts` into `slots` (from `free_slots`); returns their next-token logits."""
        device = next(model.parameters()).device
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        layers = out.past_key_values.layers
        if not self.keys:
            self.end = self.lo = width
            self._allocate(len(layers), len(slots), 2 * width + 64, layers[0].keys)
        self._make_room(slots=max(slots) + 1, left=width)
        idx = torch.tensor(slots, device=device)
        for i, layer in enumerate(layers):
            self.keys[i][idx, :, self.end - width:self.end] = layer.keys
            self.values[i][idx, :, self.end - width:self.end] = layer.values
        self.live += [False] * (max(slots) + 1 - self.used)
        for r, s in enumerate(slots):
            self.live[s] = True
            self.start[s] = self.end - len(prompts[r])
        self.lo = int(self.start[:self.used][self._live_mask()].min())
        return out.logits[:, -1]

    # -- decoding -----------------------------------------------------------------------------
    def decode(self, model, last: torch.Tensor) -> torch.Tensor:
        """Feed each used slot's last sampled token (used,); returns the next logits (used, V)."""
        self._make_room(slots=self.used, left=0)
        n = self.used
        columns = torch.arange(self.lo, self.end + 1, device=last.device)
        mask = (columns[None, :] >= self.start[:n, None]).long()              # (n, end - lo + 1)
        positions = (self.end - self.start[:n]).clamp(min=0)[:, None]
        cache = DynamicCache()
        cache.layers = [_SlotLayer(self, i) for i in range(len(self.keys))]
        out = model(input_ids=last[:, None], attention_mask=mask, position_ids=positions,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.end += 1
        return out.logits[:, -1]

    # -- rows out -----------------------------------------------------------------------------
    def drop(self, slots: list[int]) -> None:
        """Free `slots`; their rows are gone (finished or aborted)."""
        for s in slots:
            self.live[s] = False
            self.start[s] = self.end  # masks every column: the slot holds nothing
        while self.live and not self.live[-1]:
            self.live.pop()
        if any(self.live):
            self.lo = int(self.start[:self.used][self._live_mask()].min())
        else:
            self.live, self.lo = [], self.end

    def compact(self) -> list[int] | None:
        """When half the used slots are free, move the live ones to the front (one copy).
        Returns the old slot of each new one, or None when nothing moved."""
        if not self.live or sum(self.live) * 2 > self.used:
            return None
        order = [i for i, alive in enumerate(self.live) if alive]
        idx = torch.tensor(order, device=self.start.device)
        for buffers in (self.keys, self.values):
            for i, b in enumerate(buffers):
                b[:len(order)] = b[idx]
        self.start[:len(order)] = self.start[idx].clone()
        self.live = [True] * len(order)
        return order

    # -- room ---------------------------------------------------------------------------------
    def _live_mask(self) -> torch.Tensor:
        return torch.tensor(self.live, device=self.start.device)

    def _allocate(self, layers: int, slots: int, columns: int, like: torch.Tensor) -> None:
        _, heads, _, dim = like.shape
        self.keys = [like.new_zeros(slots, heads, columns, dim) for _ in range(layers)]
        self.values = [like.new_zeros(slots, heads, columns, dim) for _ in range(layers)]
        self.start = torch.full((slots,), self.end, dtype=torch.long, device=like.device)

    def _make_room(self, slots: int, left: int) -> None:
        """Room for `slots` slots, `left` columns before `end` (a prefill's width) and one
        column at `end` (a decode step's): the live window moves to the front of new buffers
        (twice the room it needs) when the buffers are short of any."""
        have_slots, columns = self.keys[0].shape[0], self.keys[0].shape[2]
        first = min(self.lo, self.end - left)  # the first column in use after this
        if slots <= have_slots and first >= 0 and self.end + 1 <= columns:
            return
        window = self.end - first
        new_slots = max(slots, have_slots) if slots <= have_slots else max(slots, 2 * have_slots)
        new_columns = max(columns, 2 * (window + 1) + 64)
        shift = -first  # column c moves to c + shift
        used = self.used
        held = max(first, 0)  # a wide prompt can reach left of column 0: nothing is there
        for buffers in (self.keys, self.values):
            for i, b in enumerate(buffers):
                fresh = b.new_zeros(new_slots, b.shape[1], new_columns, b.shape[3])
                fresh[:used, :, held + shift:window] = b[:used, :, held:self.end]
                buffers[i] = fresh
        start = torch.full((new_slots,), self.end + shift, dtype=torch.long,
                           device=self.start.device)
        start[:used] = self.start[:used] + shift
        self.start, self.lo, self.end = start, self.lo + shift, self.end + shift
