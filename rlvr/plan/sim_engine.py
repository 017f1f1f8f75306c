"""The engine the simulator's actors decode with: the engine interface, without a model.

What: `SimEngine` is what actors/rollouts.py drives (actors/engines/__init__.py's interface);
its requests sample the lengths their prompt's `PromptPlan` gives, and its time is priced by
`DecodeCost`. All running requests advance one token per decode step, a step costs
`DecodeCost.decode(rows, columns)`, and requests that start cost `DecodeCost.prefill(rows,
width)` once (the prefill samples a request's first token). A request's context is its prompt,
the partial response it continues (`recompute`) and what it has sampled since; vLLM's rows each
attend over their own, the HF engine's sit in KV slots (`kv_slots`, tasks/kv_slots.py): every
slot in use attends over one window as wide as the longest context among them, a freed slot is
computed on until half of them are free (then the live ones move to the front) unless it is the
last in use, and a new row takes the lowest free slot. A prefill costs per row, by its width
(the HF engine pads rows to the longest, vLLM packs them: their mean), by the width's square and
by the pass's tokens squared.

Which sample a request is: its prompt's token ids are the prompt's key (negative), the tokens it
samples are its sample's id, so a request that continues a partial response names its sample in
its prompt; a fresh request takes its stage's next sample in the plan (the scheduler says the
stage), a sample dropped or stopped before it sampled anything is taken again by the request
that replaces it, and a stage asked for more samples than the plan logged (siblings aborted
before they finished) gets the stage's longest, incorrect.

Time: between two events (a request ends, work arrives, a sync) every running request advances
by the same number of steps, so the simulator jumps from event to event (`work_to_next_event`,
`advance`). No I/O, no clock.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from dataclasses import dataclass, fields, replace

from tasks.sampling import Aborted, Finished


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
    """The HF engine's KV slots: every slot in use, free ones too (as the engine keeps them),
    attends over the longest context among the rows; else each row over its own (vLLM's paged
    KV)."""

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
    correct: tuple[tuple[bool, ...], ...] = ()
    """Per stage, each sample's verdict; empty: every stage's samples incorrect but the last
    stage's first (the plan's stages are the ones a stop-on-correct policy runs)."""

    def sample(self, stage: int, index: int) -> tuple[int, bool]:
        """(length, correct) of the stage's index-th sample; past the plan, its longest stage's
        longest, incorrect."""
        if stage >= len(self.stages) or index >= len(self.stages[stage]):
            lengths = self.stages[min(stage, len(self.stages) - 1)]
            return max(lengths), False
        if self.correct:
            return self.stages[stage][index], bool(self.correct[stage][index])
        return self.stages[stage][index], stage == len(self.stages) - 1 and index == 0


@dataclass
class _Request:
    rid: int
    key: int  # its prompt's
    sample: int  # id of the sample it generates (the token it samples)
    length: int  # tokens it samples
    has: int = 0  # tokens of the partial response it continues
    seq: int = 0  # order started
    start: float = 0.0  # the decode step its first token (the prefill's) comes at
    end: float = 0.0  # the decode step its last token comes at
    offset: float = 0.0  # its context at decode step 0
    version: int = 0  # weights it started under


class SimEngine:
    """The engine interface `Rollouts` drives (actors/engines/__init__.py), decoding nothing:
    requests sample their plan's lengths, and time is priced by `DecodeCost`."""

    def __init__(self, cost: DecodeCost):
        self.cost = cost
        self.policy_version = 0
        self.last_step_rows = 0
        self.prefix_cache_resets_refused = 0
        self.stage_of = None  # request id -> its prompt's stage (the scheduler's)
        self.redo = False  # requests aborted now are sampled again from scratch (`abort`)
        self.syncing = False  # a sync stops requests now: the prefill in progress is given up
        self.plans: dict[int, PromptPlan] = {}  # by prompt key
        # id -> (prompt key, stage, length, correct)
        self.samples: dict[int, tuple[int, int, int, bool]] = {}
        self._taken: defaultdict = defaultdict(int)  # (key, stage) -> samples handed out
        self._returned: defaultdict = defaultdict(deque)  # (key, stage) -> samples to redo
        self._sample_ids = 0
        self._samples_of: defaultdict = defaultdict(list)  # by prompt key
        self._ids: dict[int, list[int]] = {}  # each prompt's token ids, by key
        self.queued: deque[_Request] = deque()
        self._heap: list = []  # heap of (end, seq, request)
        self._live: dict[int, _Request] = {}  # the running requests by id, in the order started
        self.steps = 0.0  # decode steps done
        self.stall = 0.0  # work-seconds of prefill before decoding goes on
        self._seq = 0
        self._same_step = False  # requests started since the last advance: one engine step
        self._unpaid_from = 0  # while a stall is left: the first seq of the prefill it pays for
        self._offset_sum = 0.0  # sum of the running requests' contexts at step 0
        self._widest: list = []  # heap (-context at step 0, seq), lazily pruned
        self._slots = 0  # kv_slots: slots in use, free ones among them (up to the last live one)
        self._slot_of: dict[int, int] = {}  # seq of each running request -> its slot
        self._in_use: set[int] = set()  # slots of the running rows
        self._free: list[int] = []  # heap of free slots below _slots, lazily pruned

    # -- the engine interface ---------------------------------------------------------------
    @property
    def max_rows(self) -> int:
        return self.cost.max_batch

    def add(self, request_id: int, prompt_token_ids: list[int], max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0) -> None:
        key = -prompt_token_ids[0]
        has = len(prompt_token_ids) - self._prompt_ids(key)
        if has:  # a continuation: its prompt ends with its sample's tokens
            sample = prompt_token_ids[-1]
        else:
            sample = self._next_sample(key, self.stage_of(request_id))
        length = min(self.samples[sample][2] - has, max_new_tokens)
        self.queued.append(_Request(request_id, key, sample, max(1, length), has))

    def step(self, admit: bool = True) -> list[Finished]:
        """The requests ended by now (once the prefill is paid), then the queued ones start."""
        done = []
        while (self._heap and self.stall <= 1e-15
               and self._heap[0][0] <= self.steps + 1e-9):
            _, _, r = heapq.heappop(self._heap)
            del self._live[r.rid]
            self._free_slot(r.seq)
            self._offset_sum -= r.offset
            done.append(Finished(r.rid, [r.sample] * r.length, [0.0] * r.length,
                                 [(r.version, r.length)], False))
        if not self._heap:
            self._offset_sum, self._widest = 0.0, []  # no drift, no dead entries kept
        elif len(self._widest) > 2 * len(self._heap) + 64:  # dead entries below the top
            self._widest = [(-r.offset, r.seq) for *_, r in self._heap]
            heapq.heapify(self._widest)
        self._compact()
        if admit:
            self._start()
        self.last_step_rows = len(self._heap)
        return done

    def abort(self, request_ids) -> list[Aborted]:
        """Stopped requests keep what they sampled (none while their prefill is unpaid); a
        sample with nothing sampled goes back to its stage, for the request that replaces it."""
        stop = set(request_ids)
        unpaid_from = self._unpaid_from if self.stall > 1e-15 else math.inf
        out = []
        for r in list(self._live.values()):
            if r.rid in stop:
                sampled = 0 if r.seq >= unpaid_from else min(
                    r.length, 1 + math.floor(self.steps - r.start + 1e-9))
                out.append(self._aborted(r, sampled))
        out += [self._aborted(r, 0) for r in self.queued if r.rid in stop]
        self.queued = deque(r for r in self.queued if r.rid not in stop)
        self._run([e for e in self._heap if e[2].rid not in stop])
        if self.syncing:
            self.stall = 0.0
        return out

    def running(self) -> list[int]:
        return list(self._live)

    def due(self, admit: bool) -> bool:
        """Would a `step(admit)` now end a request or start one?"""
        return bool(admit and self.queued and len(self._heap) < self.cost.max_batch
                    or self._heap and self.stall <= 1e-15
                    and self._heap[0][0] <= self.steps + 1e-9)

    def unfinished(self) -> int:
        return len(self._heap) + len(self.queued)

    def close(self) -> None:
        pass

    # -- time ---------------------------------------------------------------------------------
    @property
    def computing(self) -> bool:
        return bool(self._heap) or self.stall > 1e-15

    def _step_cost(self) -> tuple[float, float]:
        """(cost of the next decode step, its growth per step after): with the rows constant,
        every row's context (or the shared window) grows by one column a step."""
        rows = len(self._heap)
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
        if first <= 0:
            return math.sqrt(2 * work / growth)
        return 2 * work / (first + math.sqrt(first * first + 2 * growth * work))

    def work_to_next_event(self) -> float:
        """Work-seconds until a request ends (or the prefill is paid)."""
        work = self.stall
        if self._heap:
            first, growth = self._step_cost()
            steps = max(0.0, self._heap[0][0] - self.steps)
            work += first * steps + growth * steps * steps / 2
        return max(0.0, work)

    def advance(self, work: float) -> None:
        """Compute `work` work-seconds: the prefill's first, then decode steps."""
        if work > 0:
            self._same_step = False
        burn = min(self.stall, work)
        self.stall -= burn
        work -= burn
        if self._heap:
            first, growth = self._step_cost()
            if first <= 0 and growth <= 0:  # free decoding: the next request ends at once
                self.steps = max(self.steps, self._heap[0][0])
            elif work > 0:
                self.steps += self._steps_for(work, first, growth)

    # -- samples ------------------------------------------------------------------------------
    def _prompt_ids(self, key: int) -> int:
        return len(self._ids[key])

    def _prompt_tokens(self, key: int) -> float:
        return self.plans[key].prompt or self.cost.prompt_tokens

    def prompt_token_ids(self, key: int) -> list[int]:
        if key not in self._ids:
            self._ids[key] = [-key] * max(1, round(self._prompt_tokens(key)))
        return self._ids[key]

    def _next_sample(self, key: int, stage: int) -> int:
        if self._returned[key, stage]:
            return self._returned[key, stage].popleft()
        index = self._taken[key, stage]
        self._taken[key, stage] += 1
        self._sample_ids += 1
        sample = self._sample_ids
        self.samples[sample] = (key, stage, *self.plans[key].sample(stage, index))
        self._samples_of[key].append(sample)
        return sample

    def _aborted(self, r: _Request, sampled: int) -> Aborted:
        if self.redo or sampled == 0 and not r.has:
            self._returned[r.key, self.samples[r.sample][1]].append(r.sample)
        return Aborted(r.rid, sampled, 0.0, (r.sample,) * sampled, (0.0,) * sampled,
                       ((r.version, sampled),) if sampled else ())

    def forget(self, key: int) -> None:
        """A prompt's group is done: its samples are not asked for again."""
        del self.plans[key], self._ids[key]
        stages = {self.samples.pop(s)[1] for s in self._samples_of.pop(key, ())}
        for stage in stages:
            self._taken.pop((key, stage), None)
            self._returned.pop((key, stage), None)

    # -- running requests ---------------------------------------------------------------------
    def _run(self, entries: list) -> None:
        """The running requests are these (a sync stopped the others)."""
        self._heap = list(entries)
        heapq.heapify(self._heap)
        self._live = {r.rid: r for *_, r in sorted(entries, key=lambda e: e[1])}
        for seq in set(self._slot_of) - {r.seq for *_, r in entries}:
            self._free_slot(seq)
        self._offset_sum = sum(r.offset for *_, r in entries)
        self._widest = [(-r.offset, r.seq) for *_, r in entries]
        heapq.heapify(self._widest)
        self._compact()

    def _start(self) -> None:
        """Requests waiting start while there is room."""
        started, widest, total = 0, 0.0, 0.0
        if self.stall <= 1e-15:  # a new prefill: the earlier ones are paid
            self._unpaid_from = self._seq + 1
        while self.queued and len(self._heap) < self.cost.max_batch:
            r = self.queued.popleft()
            self._seq += 1
            # its context at a later step s is offset + s; the prefill samples the first token,
            # each decode step one more
            r.seq, r.version = self._seq, self.policy_version
            r.offset = self._prompt_tokens(r.key) + r.has - self.steps
            r.start, r.end = self.steps, self.steps + max(0, r.length - 1)
            heapq.heappush(self._heap, (r.end, r.seq, r))
            self._live[r.rid] = r
            self._take_slot(r.seq)
            self._offset_sum += r.offset
            if self.cost.kv_slots:
                heapq.heappush(self._widest, (-r.offset, r.seq))
            started += 1
            plan = self.plans[r.key]
            width = r.has + ((plan.prompt or self.cost.prompt_width) if self.cost.kv_slots
                             else self._prompt_tokens(r.key))
            widest, total = max(widest, width), total + width
        if started:  # requests added at one moment start in one engine step
            # the HF engine pads them to the longest, vLLM packs them
            width = widest if self.cost.kv_slots else total / started
            self.stall += self.cost.prefill(started, width) - (self.cost.prefill_s
                                                              if self._same_step else 0.0)
            self._same_step = True

    # -- the HF engine's KV slots (tasks/kv_slots.py), as it takes and frees them -------------
    def _take_slot(self, seq: int) -> None:
        """A new row takes the lowest free slot, else one past those in use."""
        while self._free and (self._free[0] >= self._slots or self._free[0] in self._in_use):
            heapq.heappop(self._free)  # given up at the end since, or taken
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot, self._slots = self._slots, self._slots + 1
        self._slot_of[seq] = slot
        self._in_use.add(slot)

    def _free_slot(self, seq: int) -> None:
        """A row ended: its slot is free; free slots at the end are given up at once."""
        slot = self._slot_of.pop(seq)
        self._in_use.discard(slot)
        heapq.heappush(self._free, slot)
        while self._slots and self._slots - 1 not in self._in_use:
            self._slots -= 1

    def _compact(self) -> None:
        """Half the slots in use free: the live ones move to the front, in their order."""
        if 2 * len(self._slot_of) <= self._slots:
            order = sorted(self._slot_of, key=self._slot_of.get)
            self._slot_of = {seq: i for i, seq in enumerate(order)}
            self._slots, self._free, self._in_use = len(order), [], set(range(len(order)))
