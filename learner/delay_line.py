"""Injected staleness (`stale_inject: K`, docs/ALGORITHMS.md 8.2b): a delay line of gathered
steps at the learner, so that each step trains the groups gathered K steps before.

The first step of a run (or of a resume) gathers K + 1 steps' groups with its weights (admission
lets them out: its bound is raised by K), every later step one more, and each step trains the
oldest. So the first K steps train the start's data at staleness 0, 1, .. K - 1, and from then on
every group trains K versions after the step that gathered it. The groups in the line stay
pending in the coordinator until they are trained: a checkpoint keeps their prompts, and a
resume fills the line anew.

The fill's K + 1 steps are gathered with one version's weights, and groups come back in the
order they finish: dealt out as they came, the first steps would train the quick (short, easy)
prompts and the last ones the slow (long, hard) ones, a length and difficulty sort that no
other run has. So the fill is dealt again in the order its prompts were handed out, as a run
without the line would have taken them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from protocol.messages import Group


@dataclass
class GatheredStep:
    version: int  # the learner's version when it was gathered
    kept: list[Group]  # to train
    generated: list[Group]  # every group generated for the step (kept among them)
    dropped: list[Group]  # dropped as too stale
    info: dict  # the gathering's metrics


def deal_in_handout_order(steps: list[GatheredStep],
                          handout_order: Callable[[list[Group]], list[Group]]
                          ) -> list[GatheredStep]:
    """The same steps with their groups dealt again in hand-out order: every step keeps its
    number of kept, other generated (DAPO's filtered and surplus) and dropped groups, and its
    gathering's metrics (counts, which the deal keeps). Only steps gathered with one version's
    weights can swap groups, or a group's staleness would change."""
    if len({step.version for step in steps}) > 1:
        raise ValueError("the delay line deals again only steps gathered at one version, got "
                         f"versions {sorted({step.version for step in steps})}")

    def others(step: GatheredStep) -> list[Group]:
        kept = {g.group_id for g in step.kept}
        return [g for g in step.generated if g.group_id not in kept]

    def deal(pool: list[Group], sizes: list[int]) -> list[list[Group]]:
        ordered, hands = handout_order(pool), []
        for size in sizes:
            hands.append(ordered[:size])
            ordered = ordered[size:]
        return hands

    def pooled(part: Callable[[GatheredStep], list[Group]]) -> list[list[Group]]:
        return deal([g for step in steps for g in part(step)], [len(part(s)) for s in steps])

    kept, rest, dropped = (pooled(lambda s: s.kept), pooled(others),
                           pooled(lambda s: s.dropped))
    return [GatheredStep(step.version, k, [*k, *o], d, step.info)
            for step, k, o, d in zip(steps, kept, rest, dropped)]


class DelayLine:
    def __init__(self, k: int, gather: Callable[[], GatheredStep],
                 trained: Callable[[list[str]], None],
                 handout_order: Callable[[list[Group]], list[Group]]):
        self.k, self.gather, self.trained = k, gather, trained
        self.handout_order = handout_order
        self.line: deque[GatheredStep] = deque()

    def waiting_groups(self) -> int:
        """Groups gathered and not yet trained (summary.json's count when the run ends)."""
        return sum(len(step.generated) for step in self.line)

    def next(self, version: int) -> GatheredStep:
        t0 = time.time()
        fill = [self.gather() for _ in range(self.k + 1 - len(self.line))]
        if len(fill) > 1:  # the first step, or a resume's: one version gathered them all
            fill = deal_in_handout_order(fill, self.handout_order)
        self.line.extend(fill)
        step = self.line.popleft()
        self.trained([g.group_id for g in [*step.generated, *step.dropped]])
        step.info = {**step.info, "perf/learner_idle_s": time.time() - t0,
                     "stale/injected": version - step.version,
                     "stale/line_groups": self.waiting_groups()}
        return step
