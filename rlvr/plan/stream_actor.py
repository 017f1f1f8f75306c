"""An actor as the simulator plays it: one engine decoding every request it holds at once.

What: `StreamActor` is actors/worker.py's loop reduced to its timing. Each prompt handed to it
runs its stages (a `PromptPlan`: per stage the lengths of its samples); a stage's samples are
requests that start as soon as the engine has room (`max_batch` rows), and the prompt's next
stage is queued the moment its current one is done, without waiting for the other prompts of
the work item (actors/scheduler.py). All running requests advance one token per decode step,
and a step costs `DecodeCost.decode(rows, columns)`; requests that start cost
`DecodeCost.prefill(rows, width)` once (Context, below). A prompt whose last stage is done is a group, with the oldest weights version any of its
finished samples started under (its oldest token). A weight sync (`sync`) is served as
`actors.inflight_update` says: `finish` holds new requests until the running ones are done, then
the actor joins the broadcast; `continue` joins at once and the running requests decode on under
the new weights; `abort` drops the running requests (their tokens are wasted) and queues them
again, to start under the new weights, except a request already dropped `abort_limit` times,
which decodes on (actors.abort_limit); `recompute` stops the running requests and queues what
each has left, keeping its tokens and the version of its oldest one: prompt and partial response
are prefilled again.

Context: a decode step costs more the more keys and values its rows attend over
(`DecodeCost.col_s`): a row's context is its prompt, the partial response it was restarted
with under `recompute`, and the tokens it has sampled since; vLLM's rows each attend over their
own. The HF engine keeps its rows in KV slots (`kv_slots`, tasks/kv_slots.py): every
slot in use attends over one window as wide as the longest context among them, and a freed
slot is computed on until half of them are free (then the live ones move to the front), unless
it is the last in use (given up at once); a new row takes the lowest free slot. A
prefill costs per row, by its width (prompt, and under `recompute` the partial answer; the HF
engine pads its rows to the longest, vLLM packs them: their mean), by the width's square
(attention within it) and by the prefill's tokens squared (a pass outgrowing the caches).

Time: the actor keeps its own count of decode steps; between two events (a request ends, work
arrives, a sync) every running request advances by the same number of steps, so the simulator
jumps from event to event instead of from step to step (`seconds_to_next_event`, `advance`).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field, fields, replace


@dataclass(frozen=True)
class DecodeCost:
    """Work-seconds of one actor's engine (rlvr/plan/decode_probe.py measures them)."""

    step_s: float
    """Per decode step, whatever the rows (kernel launches, the Python loop, messages)."""
    row_s: float = 0.0
    """Per running request per decode step."""
    prefill_s: float = 0.0
    """Per engine step that starts new requests."""
    prefill_row_s: float = 0.0
    """Per request started (its prompt's forward)."""
    max_batch: int = 512
    """Requests decoding at once (actors.max_batch); more wait for room."""
    col_s: float = 0.0
    """Per column of keys and values attended over per decode step (rows x context)."""
    prefill_col_s: float = 0.0
    """Per row of a prefill per column of its width (the HF engine's rows padded to the longest,
    vLLM's packed: their mean)."""
    prefill_sq_s: float = 0.0
    """Per row of a prefill per column squared (attention within the prefill)."""
    prefill_tokens_sq_s: float = 0.0
    """Per token of a prefill squared, (rows x width)^2: a pass that outgrows the caches pays
    more for each token the more it holds."""
    prompt_tokens: float = 0.0
    """A request's prompt (tokens, the mean), where its plan does not say (PromptPlan.prompt)."""
    prompt_width: float = 0.0
    """The width of the HF engine's prefill of fresh prompts (the longest prompt), where their
    plans do not say."""
    kv_slots: bool = False
    """The HF engine's KV slots: every slot in use, free ones too (as the engine keeps them), attends
    over the longest context among the rows; else each row over its own (vLLM's paged KV)."""

    def decode(self, rows: int, columns: float = 0.0) -> float:
        return self.step_s + self.row_s * rows + self.col_s * columns

    def scaled(self, k: float) -> DecodeCost:
        """Every cost times `k` (the fields in seconds: named *_s); the shape fields kept."""
        return replace(self, **{f.name: k * getattr(self, f.name) for f in fields(self)
                                if f.name.endswith("_s")})

    def prefill(self, rows: int, width: float = 0.0) -> float:
        """`rows` started in one step, padded to `width` tokens (the longest among them)."""
        if not rows:
            return 0.0
        return (self.prefill_s + rows * (self.prefill_row_s + self.prefill_col_s * width
                                         + self.prefill_sq_s * width * width)
                + self.prefill_tokens_sq_s * (rows * width) ** 2)


@dataclass(frozen=True)
class PromptPlan:
    """One prompt's generation: per stage, the lengths (tokens) of the samples it runs."""

    stages: tuple[tuple[int, ...], ...]
    train_tokens: float = 0.0
    """Response tokens of its group that will be trained on (nonzero advantage)."""
    prompt: int = 0
    """Its prompt's tokens (0: unknown, DecodeCost.prompt_tokens / prompt_width stand in)."""


@dataclass
class _Prompt:
    plan: PromptPlan
    stage: int = 0
    left: int = 0  # samples of the current stage still decoding or queued
    version: int | None = None  # oldest weights a finished sample started under


@dataclass
class StreamActor:
    cost: DecodeCost
    version: int = 0
    inflight: int = 0  # prompts handed to it whose group is not back yet
    holding: bool = False
    busy_s: float = 0.0  # wall seconds spent computing
    abort_limit: int | None = None  # actors.abort_limit (None: `abort` drops every time)
    queued: deque = field(default_factory=deque)  # waiting for room: (prompt, length, restarts,
    #                        version of its oldest token if it continues, tokens it has already)
    running: list = field(default_factory=list)  # heap: (ends at step, seq, prompt, length,
    #     weights version it started under, restarts, its context at step 0: prompt + tokens
    #     it started with - the step it started at)
    steps: float = 0.0  # decode steps done
    stall: float = 0.0  # work-seconds of prefill before decoding goes on
    _seq: int = 0
    _same_step: bool = False  # requests started since the last advance: one engine step
    _unpaid_from: int = 0  # while a stall is left: the first seq of the prefill it pays for
    _offset_sum: float = 0.0  # sum of the running requests' contexts at step 0
    _widest: list = field(default_factory=list)  # heap (-context at step 0, seq), lazily pruned
    _slots: int = 0  # kv_slots: slots in use, free ones among them (up to the last live one)
    _slot_of: dict = field(default_factory=dict)  # seq of each running request -> its slot
    _taken: set = field(default_factory=set)  # slots of the running rows
    _free: list = field(default_factory=list)  # heap of free slots below _slots, lazily pruned

    @property
    def computing(self) -> bool:
        return bool(self.running) or self.stall > 1e-15

    def add(self, plans: list[PromptPlan]) -> None:
        """A work item: every prompt's first stage is queued."""
        self.inflight += len(plans)
        for plan in plans:
            self._queue_stage(_Prompt(plan))
        self._start()

    def sync(self, policy: str) -> None:
        """A weight sync is announced: `finish`, `abort` and `recompute` hold new requests until
        `release`; `abort` also drops the running ones, to be sampled again; `recompute` stops
        them and queues what each has left, to be prefilled again under the new weights."""
        match policy:
            case "finish":
                self.holding = True
            case "abort":
                self.holding = True
                kept, dropped = [], []
                for r in self.running:
                    at_limit = self.abort_limit is not None and r[5] >= self.abort_limit
                    (kept if at_limit else dropped).append(r)
                dropped.sort(key=lambda r: r[1])  # in the order they started
                self._run(kept)
                self.queued.extendleft((prompt, length, restarts + 1, None, 0)
                                       for _, _, prompt, length, _, restarts, _
                                       in reversed(dropped))
            case "recompute":  # stopped, kept: the rest is queued, prefilled again, same version
                # a prefill samples a token: the re-prefill of prompt + partial response the
                # first of what is left (actors/scheduler.py re-submits it as a request)
                self.holding = True
                stopped = sorted(self.running, key=lambda r: r[1])
                unpaid_from = self._unpaid_from if self.stall > 1e-15 else math.inf
                self._run([])
                queue = []
                for end, seq, prompt, _, version, _, offset in stopped:
                    left = max(1, math.ceil(end - self.steps - 1e-9))
                    # its answer so far: its context now, less its prompt
                    has = max(0.0, offset + self.steps - self._prompt_tokens(prompt))
                    if seq >= unpaid_from:  # its prefill not done: nothing sampled yet
                        queue.append((prompt, 1 + left, 0, version if has else None, has))
                    else:
                        queue.append((prompt, left, 0, version, has))
                self.queued.extendleft(reversed(queue))
            case "continue":
                pass
            case _:
                raise ValueError(f"inflight_update must be finish, continue, abort or recompute: "
                                 f"{policy!r}")

    def release(self, version: int) -> None:
        self.holding, self.version = False, version
        self._start()

    # -- time ---------------------------------------------------------------------------------
    def _step_cost(self) -> tuple[float, float]:
        """(cost of the next decode step, its growth per step after): with the rows constant,
        every row's context (or the shared window) grows by one column a step."""
        rows = len(self.running)
        if not rows:
            return 0.0, 0.0
        if self.cost.kv_slots:
            while self._widest[0][1] not in self._slot_of:
                heapq.heappop(self._widest)
            context = -self._widest[0][0] + self.steps
            rows = self._slots
        else:
            context = self._offset_sum / rows + self.steps
        return self.cost.decode(rows, rows * context), self.cost.col_s * rows

    @staticmethod
    def _steps_for(work: float, first: float, growth: float) -> float:
        """Decode steps `work` pays for, the first costing `first` and each next `growth` more
        (the root of first x n + growth x n^2 / 2 = work, in its stable form)."""
        if growth <= 0:
            return work / first
        return 2 * work / (first + math.sqrt(first * first + 2 * growth * work))

    def seconds_to_next_event(self, speed: float) -> float:
        """Wall seconds until a request ends (or the prefill is done), at `speed`."""
        work = self.stall
        if self.running:
            first, growth = self._step_cost()
            steps = max(0.0, self.running[0][0] - self.steps)
            work += first * steps + growth * steps * steps / 2
        return max(0.0, work) / speed

    def advance(self, dt: float, speed: float) -> list[tuple[int, float]]:
        """Compute for `dt` wall seconds at `speed`; returns the groups completed, as
        (weights version, train tokens)."""
        if not self.computing:
            return []
        self.busy_s += dt
        work = dt * speed
        if work > 0:
            self._same_step = False
        burn = min(self.stall, work)
        self.stall -= burn
        work -= burn
        if self.running:
            first, growth = self._step_cost()
            if first <= 0 and growth <= 0:  # free decoding: the next request ends at once
                self.steps = max(self.steps, self.running[0][0])
            elif work > 0:
                self.steps += self._steps_for(work, first, growth)
        done = []
        while self.running and self.running[0][0] <= self.steps + 1e-9:
            _, seq, prompt, _, version, _, offset = heapq.heappop(self.running)
            self._free_slot(seq)
            self._offset_sum -= offset
            prompt.version = version if prompt.version is None else min(prompt.version, version)
            prompt.left -= 1
            if prompt.left == 0:
                prompt.stage += 1
                if prompt.stage < len(prompt.plan.stages):
                    self._queue_stage(prompt)
                else:
                    self.inflight -= 1
                    done.append((prompt.version, prompt.plan.train_tokens))
        if not self.running:
            self._offset_sum, self._widest = 0.0, []  # no drift, no dead entries kept
        elif len(self._widest) > 2 * len(self.running) + 64:  # dead entries below the top
            self._widest = [(-r[6], r[1]) for r in self.running]
            heapq.heapify(self._widest)
        self._compact()
        self._start()
        return done

    # -- requests -----------------------------------------------------------------------------
    def _queue_stage(self, prompt: _Prompt) -> None:
        lengths = prompt.plan.stages[prompt.stage]
        prompt.left = len(lengths)
        self.queued.extend((prompt, n, 0, None, 0) for n in lengths)

    def _run(self, requests: list) -> None:
        """The running requests are these (a sync stopped the others)."""
        self.running = list(requests)
        heapq.heapify(self.running)
        for seq in set(self._slot_of) - {r[1] for r in requests}:
            self._free_slot(seq)
        self._offset_sum = sum(r[6] for r in requests)
        self._widest = [(-r[6], r[1]) for r in requests]
        heapq.heapify(self._widest)
        self.stall = 0.0
        self._compact()

    def _prompt_tokens(self, prompt: _Prompt) -> float:
        return prompt.plan.prompt or self.cost.prompt_tokens

    # -- the HF engine's KV slots (tasks/kv_slots.py), as it takes and frees them -----
    def _take_slot(self, seq: int) -> None:
        """A new row takes the lowest free slot, else one past those in use."""
        while self._free and (self._free[0] >= self._slots or self._free[0] in self._taken):
            heapq.heappop(self._free)  # given up at the end since, or taken
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot, self._slots = self._slots, self._slots + 1
        self._slot_of[seq] = slot
        self._taken.add(slot)

    def _free_slot(self, seq: int) -> None:
        """A row ended: its slot is free; free slots at the end are given up at once."""
        slot = self._slot_of.pop(seq)
        self._taken.discard(slot)
        heapq.heappush(self._free, slot)
        while self._slots and self._slots - 1 not in self._taken:
            self._slots -= 1

    def _compact(self) -> None:
        """Half the slots in use free: the live ones move to the front, in their order."""
        if 2 * len(self._slot_of) <= self._slots:
            order = sorted(self._slot_of, key=self._slot_of.get)
            self._slot_of = {seq: i for i, seq in enumerate(order)}
            self._slots, self._free, self._taken = len(order), [], set(range(len(order)))

    def _start(self) -> None:
        """Requests waiting start while there is room (not while a sync holds them)."""
        started, widest, total = 0, 0.0, 0.0
        if self.stall <= 1e-15:  # a new prefill: the earlier ones are paid
            self._unpaid_from = self._seq + 1
        while self.queued and not self.holding and len(self.running) < self.cost.max_batch:
            prompt, length, restarts, version, has = self.queued.popleft()
            self._seq += 1
            # its context at a later step s is offset + s; the prefill samples the first token,
            # each decode step one more
            offset = self._prompt_tokens(prompt) + has - self.steps
            heapq.heappush(self.running, (self.steps + max(0, length - 1), self._seq, prompt,
                                          length, self.version if version is None else version,
                                          restarts, offset))
            self._take_slot(self._seq)
            self._offset_sum += offset
            if self.cost.kv_slots:
                heapq.heappush(self._widest, (-offset, self._seq))
            started += 1
            width = has + ((prompt.plan.prompt or self.cost.prompt_width) if self.cost.kv_slots
                           else self._prompt_tokens(prompt))
            widest, total = max(widest, width), total + width
        if started:  # requests added at one moment start in one engine step
            # the HF engine pads them to the longest, vLLM packs them
            width = widest if self.cost.kv_slots else total / started
            self.stall += self.cost.prefill(started, width) - (self.cost.prefill_s
                                                              if self._same_step else 0.0)
            self._same_step = True
