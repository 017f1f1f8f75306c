"""An actor as the simulator plays it: the actor's own rollout code over an engine that keeps time.

What: `SimActor` is the real `Rollouts` (actors/rollouts.py), so the real per-prompt scheduler
(actors/scheduler.py) decides every stage, sibling abort and restart, and a weight sync is
served by the calls actors/worker.py's `serve_syncs` makes (`finish`: hold, and the sync waits
for the running requests; `abort`: drop them, a request already restarted `abort_limit` times
decoding on; `recompute`: stop them and go on from prompt + partial response; `continue`:
nothing). Only the engine and the verifier are stand-ins: rlvr/plan/sim_engine.py's
`SimEngine` decodes no model but prices each step, and a prompt's `PromptPlan` says how long
each of its samples is and whether it is correct (per stage, as a run logged them:
gen/prompt_lengths, gen/prompt_correct). No I/O, no clock.
"""

from __future__ import annotations

from actors.rollouts import Rollouts
from protocol.messages import PROTOCOL_VERSION, Prompt, RolloutSpec, Work
from rlvr.plan.sim_engine import DecodeCost, PromptPlan, SimEngine
from tasks.rewards import Score

__all__ = ["DecodeCost", "PromptPlan", "SimActor", "SimEngine", "plans_rollout"]


def plans_rollout(plans: list[PromptPlan]) -> RolloutSpec:
    """The rollout policy that runs `plans` as they are: one stage of each plan's samples
    (fixed), or stop-on-correct stages as large as the plans' largest."""
    longest = max(n for p in plans for stage in p.stages for n in stage)
    depth = max(len(p.stages) for p in plans)
    if depth == 1:
        return RolloutSpec(strategy="fixed", max_new_tokens=longest)
    sizes = [max(len(p.stages[s]) for p in plans if len(p.stages) > s) for s in range(depth)]
    return RolloutSpec(strategy="stop_on_correct", max_new_tokens=longest, stage_sizes=sizes)


class _Verdicts:
    """The verify queue `Rollouts` puts finished responses on, answering at once from the plan:
    a response's text is its sample's id (_SampleIds.decode)."""

    def __init__(self, engine: SimEngine):
        self.engine, self._ready = engine, []

    @property
    def pending(self) -> int:
        return len(self._ready)

    def put(self, key, response: str, answer: str, fields: dict | None = None) -> None:
        self._ready.append((key, Score.of_acc(self.engine.samples[int(response)][3])))

    def results(self, wait_s: float = 0.0) -> list:
        out, self._ready = self._ready, []
        return out

    every_result = results

    def close(self) -> None:
        pass


class _SampleIds:
    """The tokenizer `Rollouts` decodes responses with: a response's text is its sample's id."""

    @staticmethod
    def decode(token_ids, skip_special_tokens: bool = True) -> str:
        return str(token_ids[0])


class SimActor:
    """One actor: `Rollouts` over a `SimEngine`, driven by the simulator's clock."""

    def __init__(self, cost: DecodeCost, rollout: RolloutSpec | None = None,
                 abort_on_first_correct: bool = False, abort_limit: int | None = None):
        self.engine = SimEngine(cost)
        self.rollouts = Rollouts(self.engine, _SampleIds(), None, abort_on_first_correct,
                                 verify_queue=_Verdicts(self.engine))
        self.engine.stage_of = self.rollouts.sched.stage
        self.rollout, self.abort_limit = rollout, abort_limit
        self.inflight = 0  # prompts handed to it whose group is not back yet
        self.busy_s = 0.0  # wall seconds spent computing
        self._keys = 0

    @property
    def version(self) -> int:
        return self.engine.policy_version

    @property
    def steps(self) -> float:
        return self.engine.steps

    @property
    def computing(self) -> bool:
        return self.engine.computing

    def add(self, plans: list[PromptPlan]) -> list[tuple[int, float]]:
        """A work item; returns the groups completed at once (none unless a policy allots a
        prompt no sample)."""
        prompts = []
        for plan in plans:
            self._keys += 1
            self.engine.plans[self._keys] = plan
            prompts.append(Prompt(str(self._keys), str(self._keys),
                                  self.engine.prompt_token_ids(self._keys), "",
                                  len(plan.stages[0])))
        self.inflight += len(plans)
        spec = self.rollout or plans_rollout(plans)
        self.rollouts.add_work(Work(protocol_version=PROTOCOL_VERSION, policy_version=self.version,
                                    work_id=str(self._keys),
                                    prompts=prompts, rollout=spec))
        return self._settle()

    def sync(self, policy: str) -> None:
        """A weight sync is announced: served as actors/worker.py's `serve_syncs` serves it."""
        e = self.engine
        match policy:
            case "finish":
                self.rollouts.hold()
            case "abort":  # each dropped sample is sampled again, from scratch
                e.syncing = e.redo = True
                self.rollouts.drop_in_flight(self.abort_limit)
            case "recompute":
                e.syncing = True
                self.rollouts.interrupt_in_flight()
            case "continue":
                pass
            case _:
                raise ValueError(f"inflight_update must be finish, continue, abort or recompute: "
                                 f"{policy!r}")
        e.syncing = e.redo = False

    def release(self, version: int) -> list[tuple[int, float]]:
        """The new weights are in: held requests start."""
        self.engine.policy_version = version
        self.rollouts.release()
        return self._settle()

    def seconds_to_next_event(self, speed: float) -> float:
        return self.engine.work_to_next_event() / speed

    def advance(self, dt: float, speed: float) -> list[tuple[int, float]]:
        """Compute for `dt` wall seconds at `speed`; returns the groups completed, as
        (weights version, train tokens)."""
        if not self.computing:
            return []
        self.busy_s += dt
        self.engine.advance(dt * speed)
        return self._settle()

    def _settle(self) -> list[tuple[int, float]]:
        """Let the rollout code act on what ended: verdicts, next stages, requests started, at
        this moment (one engine step)."""
        done = []
        while True:
            done += self.rollouts.step()
            if not self.engine.due(admit=not self.rollouts.holding):
                break
        groups = []
        for result in done:
            key = int(result.prompt.prompt_id)
            versions = [s.policy_version for s in result.samples]
            groups.append((min(versions, default=self.version),
                           self.engine.plans[key].train_tokens))
            self.engine.forget(key)
        self.inflight -= len(groups)
        return groups
