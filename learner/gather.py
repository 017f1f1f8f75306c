"""A step's groups: admission by the schedule's clock, then gathering what came back.

`async` and `sync` admit work up to the staleness bound ahead of the version the actors hold.
`staged` (Mu-GRPO) admits a whole stage of mugrpo.updates_per_stage steps' groups with the
stage's weights and publishes new weights only when the stage is trained. DAPO's dynamic sampling
happens at gathering: groups come in generation batches (3x the step's prompts), another whole
batch follows while the informative groups do not fill the step, the surplus is dropped, and
every response counts as generated. Under `stale_inject` K a delay line hands out the step
gathered K steps before (learner/delay_line.py).
"""

from __future__ import annotations

import time

from learner.algorithms import AlgorithmState
from learner.delay_line import DelayLine, GatheredStep
from learner.losses import dapo_keep_group
from protocol.config import Config
from protocol.staleness import age


class StepGatherer:
    def __init__(self, cfg: Config, coord, algo: AlgorithmState, fleet, step: int,
                 version: int):
        """`coord`: the coordinator (learner/coordinator.py); `fleet`: the actors' weights and
        liveness (learner/fleet.py), kept while waiting."""
        self.cfg, self.coord, self.algo, self.fleet = cfg, coord, algo, fleet
        self.step, self.version = step, version
        self.stage_end = self.stage_version = self.stage_start = step  # mode=staged
        inject = cfg.staleness.inject
        self.delay_line = (DelayLine(inject, self.gather, coord.trained, coord.in_handout_order)
                           if inject else None)

    def next(self, step: int, version: int) -> GatheredStep:
        """The groups learner step `step` trains, at policy version `version`."""
        self.step, self.version = step, version
        if self.delay_line:  # stale_inject K: the step gathered K steps ago
            return self.delay_line.next(version)
        return self.gather()

    def _admit(self) -> None:
        c = self.cfg
        if c.mode != "staged":
            self.coord.admit(self.fleet.actors_version)
            return
        if self.step >= self.stage_end:  # a new stage: its groups, sampled with these weights
            length = min(c.mugrpo.updates_per_stage, c.run.steps - self.step)
            self.stage_start, self.stage_version = self.step, self.version
            self.stage_end = self.step + length
        self.coord.admit(self.stage_version, self.stage_end - self.stage_start - 1)

    def gather(self) -> GatheredStep:
        """Wait until a step's worth of fresh-enough (DAPO: informative) groups is ready.
        Returns them, every other group generated for the step (DAPO's filtered and surplus
        ones included), the groups dropped as too stale, and counts.

        Groups come in generation batches of `cfg.generation_batch` (one step's prompts, or
        DAPO's 3x): DAPO takes another whole batch while its informative groups do not fill the
        step, up to dapo.max_gen_batches, and drops the surplus (docs/ALGORITHMS.md 2); every
        response of every batch counts as generated. A stale group frees its slot for a
        replacement, and its responses count as generated too (their generation was paid for,
        3.7)."""
        c, coord, staleness = self.cfg, self.coord, self.cfg.staleness
        need, batch = c.rollout.prompts_per_step, c.generation_batch
        filtering = c.dapo.dynamic_sampling
        kept, dropped, generated, filtered, rounds = [], [], [], 0, 1
        take = coord.take_in_handout_order if c.run.deterministic else coord.take
        t0 = time.time()
        while True:
            self._admit()
            for g in take(rounds * batch - len(generated), keep_pending=staleness.inject > 0):
                self.algo.observe(g)
                if staleness.dropped(age(g, self.version)):
                    dropped.append(g)
                    coord.release(1)
                    continue
                generated.append(g)
                if filtering and not dapo_keep_group([s.acc for s in g.samples]):
                    filtered += 1
                elif len(kept) < need:
                    kept.append(g)
            if len(generated) < rounds * batch:
                coord.poll(0.05)
                self.fleet.keep(reform_at=self.version)
                continue
            if len(kept) >= need or not filtering or rounds >= c.dapo.max_gen_batches:
                break
            rounds += 1  # another generation batch for this step (admitted at this version)
            coord.release(batch)
        info = {"perf/learner_idle_s": time.time() - t0,
                "stale/dropped_frac": len(dropped) / max(len(generated) + len(dropped), 1),
                # trained although staler than the bound (stale_policy tis or downweight): the
                # groups that outlived admission's bound, kept under the behaviour weight
                "stale/over_bound_groups": sum(
                    staleness.over_bound(age(g, self.version)) for g in kept)}
        if dropped:
            info["stale/dropped_groups"] = len(dropped)
        if filtering:
            info.update({"dapo/groups_generated": len(generated), "dapo/groups_filtered": filtered,
                         "dapo/groups_surplus": len(generated) - filtered - len(kept),
                         "dapo/gen_batches": rounds, "dapo/gave_up": int(len(kept) < need)})
        return GatheredStep(self.version, kept, generated, dropped, info)

    def publishes(self, step: int, version: int) -> bool:
        """Whether the weights after learner step `step` (now `version`) go to the actors."""
        c = self.cfg
        if step == c.run.steps:
            return True
        if c.mode == "staged":  # weights move to the actors only between stages
            return step >= self.stage_end
        return version % c.weight_sync.sync_every == 0

    def stage_metrics(self, step: int) -> dict:
        """mode=staged: the update within its stage and the stage's weights (step `step`)."""
        if self.cfg.mode != "staged":
            return {}
        return {"stage/update": step - self.stage_start, "stage/policy_version": self.stage_version}
