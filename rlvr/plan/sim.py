"""An event simulation of the actor-learner schedule: what steps/min a split would reach.

What: `simulate(split, workload, costs, generation, steps)` plays the learner's loop and A actors
forward in simulated time, exactly as learner/gather.py, learner/coordinator.py and
actors/worker.py schedule them, and returns steps/min, busy fractions and the staleness reached.
Pure: no I/O, no clock, no config objects; randomness only from the `seed` given.

The schedule it plays (docs/ARCHITECTURE.md "How data flows"; docs/ALGORITHMS.md 8.2):
  - the learner gathers a step: it hands out work items of up to `prompts_per_work` prompts
    while the admission bound allows (`submitted + 1 <= (version + S + 1) * prompts_per_step`,
    S = max_staleness, 0 = sync), each to the actor with the fewest prompts in flight, and
    re-checks the bound whenever a work item comes back; it never admits while it trains;
  - an actor is the actor's own rollout code, actors/rollouts.py and its per-prompt scheduler,
    over an engine that keeps time instead of decoding (rlvr/plan/sim_actor.py, sim_engine.py):
    each prompt's stages run as soon as the engine has room, a decode step costs more with more
    rows and with longer contexts (the rows' prompts and answers so far), and a prompt's group
    comes back the moment the scheduler completes it, counted as sampled by the weights its
    first sample started under;
  - the learner takes the first `prompts_per_step` groups that came back, drops a group staler
    than S (its admission slot is freed), trains (fixed work + the update, which R data-parallel
    ranks share), and every `sync_every` steps publishes weights: every actor joins the
    broadcast as `actors.inflight_update` says (`finish`: once the requests it is decoding are
    done, starting no new ones meanwhile; an idle one joins at once; `continue`, `abort`,
    `recompute`: at once), and the broadcast itself takes `broadcast_s` once all have joined;
  - by default actors and learner ranks compute on devices of their own (a cluster); with a
    `Machine(shared_cores=C, ...)` they share C cores: while k of them compute at once each
    runs at min(1, C / k) of its speed, divided by the slowdown measured for its role when
    another computes beside it (rlvr/plan/contention.py measures it on this machine).

Steps/min and the busy fractions are over the steady window (steps after the first
`skip_first`), as `rlvr bench throughput` measures a run (rlvr/bench/run_metrics.py).

    from rlvr.plan.sim import simulate, Split, Workload, LearnerCosts, DecodeCost, fixed_prompts
    r = simulate(Split(actors=2, learner_ranks=1, max_staleness=2), Workload(32, 8),
                 LearnerCosts(fixed_s=0.03, update_s=0.07, broadcast_s=0.005),
                 fixed_prompts(length=8, samples=4), DecodeCost(step_s=0.005, row_s=1e-4),
                 steps=200)
    print(r.steps_per_min, r.stale_max)
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.staleness import Staleness
from protocol.messages import RolloutSpec
from rlvr.plan.sim_actor import SimActor
from rlvr.plan.sim_engine import DecodeCost, PromptPlan

__all__ = ["CLUSTER", "DecodeCost", "Generation", "LearnerCosts", "Machine", "PromptPlan",
           "SimResult", "Split", "Workload", "fixed_prompts", "simulate"]


@dataclass(frozen=True)
class Split:
    """How the machines are divided, and the schedule's bound."""

    actors: int
    """Actor processes, each on a device of its own."""
    learner_ranks: int = 1
    """Data-parallel learner ranks sharing each update."""
    max_staleness: int = 0
    """Admission bound S in policy versions; 0 is the synchronous schedule."""
    inflight_update: str = "finish"
    """How actors take new weights with requests running (actors.inflight_update): finish,
    continue, abort or recompute."""
    stale_policy: str = "tis"
    """A group that comes back staler than the bound (stale_policy): trained (tis, downweight)
    or dropped, its slot going to another prompt (drop)."""
    abort_limit: int | None = 2
    """Under abort: a request dropped this many times decodes on (actors.abort_limit; None:
    dropped at every sync)."""

    @property
    def staleness(self) -> Staleness:
        """The run's staleness rules (protocol/staleness.py), which the simulation applies."""
        return Staleness(self.max_staleness, policy=self.stale_policy)


@dataclass(frozen=True)
class Workload:
    """The shape of a step, from the run's config."""

    prompts_per_step: int
    """Groups per learner step (rollout.prompts_per_step)."""
    prompts_per_work: int
    """Prompts per work item handed to an actor (rollout.prompts_per_work)."""
    sync_every: int = 1
    """Weights are published every this many steps (weight_sync.sync_every)."""
    rollout: RolloutSpec | None = None
    """The rollout policy the actors run (learner/data.py `rollout_spec`); None: the one that
    runs each prompt's plan as it is (rlvr/plan/sim_actor.py `plans_rollout`)."""
    abort_on_first_correct: bool = False
    """rollout.abort_on_first_correct."""


@dataclass(frozen=True)
class LearnerCosts:
    """Seconds of the learner's own work per step."""

    fixed_s: float
    """Bookkeeping outside the update that ranks do not share (batch building, metrics, log)."""
    update_s: float
    """The update (forward, backward, optimizer step) on one rank, for a mean batch."""
    update_s_per_token: float = 0.0
    """Extra update seconds per trained token above the mean batch's (one rank); with it a
    step's update is update_s + update_s_per_token x (its trained tokens - mean_train_tokens)."""
    mean_train_tokens: float = 0.0
    """Trained tokens of the mean batch (the reference of update_s)."""
    broadcast_s: float = 0.0
    """The weight broadcast once every actor has joined it."""
    allreduce_s: float = 0.0
    """Gradient all-reduce per update when ranks > 1 (not measured on one rank: 0 unless
    given)."""

    def update(self, ranks: int, train_tokens: float) -> float:
        per_rank = self.update_s + self.update_s_per_token * (train_tokens - self.mean_train_tokens)
        return max(per_rank, 0.0) / ranks + (self.allreduce_s if ranks > 1 else 0.0)


# rng -> one prompt's stages and sample lengths; rlvr/plan/model.py builds one from a run
Generation = Callable[[random.Random], PromptPlan]


def fixed_prompts(length: int, samples: int = 1, train_tokens: float = 0.0,
                  stages: int = 1) -> Generation:
    """Every prompt runs `stages` stages of `samples` samples of `length` tokens (tests and
    back-of-envelope checks)."""
    plan = PromptPlan(((length,) * samples,) * stages, train_tokens)
    return lambda rng: plan


@dataclass
class SimResult:
    steps_per_min: float
    learner_busy_frac: float
    """1 - the learner's wait for groups / wall time (as the run logs perf/learner_idle_s)."""
    actor_busy_frac: float
    """Actor-seconds spent on work items / (wall time x actors)."""
    sync_s_per_step: float
    """Mean seconds the learner spends publishing weights (waiting for actors + broadcast)."""
    gather_s_per_step: float
    """Mean seconds the learner waits for a step's groups (G)."""
    stale_mean: float
    stale_max: int
    stale_hist: list[int]
    dropped_groups: int
    over_bound_groups: int
    """Trained groups staler than the bound (none under drop)."""
    step_s: list[float] = field(repr=False)


@dataclass(frozen=True)
class Machine:
    """Where the processes compute. Default: each on a device of its own (a cluster)."""

    shared_cores: float | None = None
    """None = separate devices; a number = actors and learner ranks share this many cores."""
    actor_slowdown: float = 1.0
    """On a shared machine: how much slower an actor computes while another process computes
    too, beyond the core count (memory bandwidth, caches, hyperthreads, other workloads)."""
    learner_slowdown: float = 1.0
    """The same for the learner."""

    def speed(self, busy: int, learner: bool = False) -> float:
        """Work-seconds per wall second of one of `busy` processes computing at once."""
        if self.shared_cores is None or busy <= 1:
            return 1.0
        slowdown = self.learner_slowdown if learner else self.actor_slowdown
        return min(1.0, self.shared_cores / busy) / slowdown


CLUSTER = Machine()


class _World:
    """The actors, the learner's computing, and the learner's view of the actors (coordinator
    state), advanced from one event to the next. Every computing process progresses at
    `machine.speed(number computing)` work-seconds per second."""

    def __init__(self, split: Split, work: Workload, generation: Generation, decode: DecodeCost,
                 machine: Machine, rng: random.Random):
        self.split, self.work, self.gen, self.machine, self.rng = split, work, generation, \
            machine, rng
        self.actors = [SimActor(decode, work.rollout, work.abort_on_first_correct,
                                split.abort_limit) for _ in range(split.actors)]
        self.learner_remaining: float | None = None  # work-seconds left of its compute
        self.now = 0.0
        self.submitted = 0
        self.ready: deque = deque()  # groups: (weights version, train tokens)
        self.dropped = self.over_bound = 0  # groups staler than the bound: dropped, trained

    def admit(self, version: int) -> None:
        """coordinator.admit: work items while the bound allows, to the least loaded actor."""
        w, staleness = self.work, self.split.staleness
        while True:
            fresh = 0
            while fresh < w.prompts_per_work and staleness.may_admit(self.submitted + fresh,
                                                                     version, w.prompts_per_step):
                fresh += 1
            if fresh == 0:
                return
            self.submitted += fresh
            actor = min(self.actors, key=lambda a: a.inflight)  # the first among equals
            self.ready.extend(actor.add([self.gen(self.rng) for _ in range(fresh)]))

    def gather(self, need: int, version: int, published: int) -> list[tuple[int, float]]:
        """learner/gather.py StepGatherer.gather: the step's `need` groups, admitting against
        the actors' weights (`published`) while the actors run; a group staler than the bound
        is dropped (its slot goes to another) or taken and counted, as the policy says."""
        staleness, taken = self.split.staleness, []
        while True:
            self.admit(published)
            while self.ready and len(taken) < need:
                group = self.ready.popleft()
                if staleness.dropped(version - group[0]):
                    self.dropped += 1
                    self.submitted -= 1
                    continue
                self.over_bound += staleness.over_bound(version - group[0])
                taken.append(group)
            if len(taken) >= need:
                return taken
            if not self.advance():
                raise RuntimeError("simulation stalled: no work in flight and none admitted")

    def _computing(self) -> int:
        learner = self.split.learner_ranks if self.learner_remaining is not None else 0
        return learner + sum(a.computing for a in self.actors)

    def advance(self) -> bool:
        """Run to the next event and handle it; False when nothing is computing. Returns True
        also when the learner's compute is what completed (learner_remaining is then None)."""
        busy = [a for a in self.actors if a.computing]
        learning = self.learner_remaining is not None
        if not busy and not learning:
            return False
        n = self._computing()
        actor_speed, learner_speed = self.machine.speed(n), self.machine.speed(n, learner=True)
        left = [a.seconds_to_next_event(actor_speed) for a in busy]
        if learning:
            left.append(self.learner_remaining / learner_speed)
        dt = max(0.0, min(left))
        self.now += dt
        for a in busy:
            self.ready.extend(a.advance(dt, actor_speed))
        if learning:
            self.learner_remaining -= dt * learner_speed
            if self.learner_remaining <= 1e-12:
                self.learner_remaining = None
        return True

    def compute(self, seconds: float) -> None:
        """The learner computes `seconds` of work while the actors go on."""
        self.learner_remaining = seconds
        while self.learner_remaining is not None and seconds > 0:
            self.advance()
        self.learner_remaining = None

    def broadcast(self, version: int, broadcast_s: float) -> None:
        """Publish `version`: under `finish` every actor holds new requests and joins once the
        running ones are done (an idle one at once), under the other policies at once; the
        broadcast takes `broadcast_s` once all have joined, then they go on with the new
        weights."""
        for a in self.actors:
            a.sync(self.split.inflight_update)
        while self.split.inflight_update == "finish" and any(a.computing for a in self.actors):
            self.advance()
        self.now += broadcast_s  # every actor is in the broadcast: nothing else computes
        for a in self.actors:
            self.ready.extend(a.release(version))


def simulate(split: Split, work: Workload, costs: LearnerCosts, generation: Generation,
             decode: DecodeCost, steps: int = 200, seed: int = 0, skip_first: int | None = None,
             machine: Machine = CLUSTER) -> SimResult:
    """Play `steps` learner steps; rates over the steps after `skip_first` (default steps/10)."""
    _check(split, work, steps)
    skip = max(1, steps // 10) if skip_first is None else skip_first
    skip = min(skip, steps - 1)
    world = _World(split, work, generation, decode, machine, random.Random(seed))
    need, bound = work.prompts_per_step, split.staleness.bound
    version = published = 0
    stale_hist = [0] * (bound + 2)
    stale_max = stale_sum = 0
    step_s, gather_s, sync_s = [], [], []
    busy_at_skip = [0.0] * split.actors
    t_skip = 0.0
    for step in range(steps):
        if step == skip:
            t_skip = world.now
            busy_at_skip = [a.busy_s for a in world.actors]
        t0 = world.now
        taken = world.gather(need, version, published)
        gather_s.append(world.now - t0)
        for v, _ in taken:
            stale_hist[min(version - v, bound + 1)] += 1
            stale_max = max(stale_max, version - v)
            stale_sum += version - v
        train_tokens = sum(tok for _, tok in taken)
        world.compute(costs.fixed_s + costs.update(split.learner_ranks, train_tokens))
        version += 1
        t_sync = world.now
        if version % work.sync_every == 0 or step == steps - 1:
            world.broadcast(version, costs.broadcast_s)
            published = version
        sync_s.append(world.now - t_sync)
        step_s.append(world.now - t0)
    window = step_s[skip:]
    wall = world.now - t_skip
    busy = sum(a.busy_s - b for a, b in zip(world.actors, busy_at_skip))
    total = sum(stale_hist)
    return SimResult(
        steps_per_min=60.0 * len(window) / wall if wall > 0 else float("inf"),
        learner_busy_frac=1.0 - sum(gather_s[skip:]) / wall if wall > 0 else 1.0,
        actor_busy_frac=busy / (wall * split.actors) if wall > 0 else 0.0,
        sync_s_per_step=sum(sync_s[skip:]) / len(window),
        gather_s_per_step=sum(gather_s[skip:]) / len(window),
        stale_mean=stale_sum / total if total else 0.0,
        stale_max=stale_max, stale_hist=stale_hist, dropped_groups=world.dropped,
        over_bound_groups=world.over_bound, step_s=step_s)


def _check(split: Split, work: Workload, steps: int) -> None:
    """Refuse a split, workload or length the schedule cannot run."""
    if split.actors < 1 or split.learner_ranks < 1 or split.max_staleness < 0:
        raise ValueError(f"need actors >= 1, learner_ranks >= 1, max_staleness >= 0: {split}")
    if split.inflight_update not in ("finish", "continue", "abort", "recompute"):
        raise ValueError(f"inflight_update must be finish, continue, abort or recompute: {split}")
    if split.stale_policy not in ("tis", "downweight", "drop"):
        raise ValueError(f"stale_policy must be tis, downweight or drop: {split}")
    if work.prompts_per_step < 1 or work.prompts_per_work < 1 or work.sync_every < 1:
        raise ValueError(f"need prompts_per_step, prompts_per_work, sync_every >= 1: {work}")
    if work.sync_every - 1 > split.max_staleness:
        # between publishes the actors' weights fall sync_every - 1 versions behind, and
        # admission counts from theirs: the last steps before a publish would wait for groups
        # the bound never lets out (the config refuses it)
        raise ValueError(f"sync_every {work.sync_every} needs max_staleness >= "
                         f"{work.sync_every - 1}, got {split.max_staleness}")
    if steps < 2:
        raise ValueError("simulate at least 2 steps")
