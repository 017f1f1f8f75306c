"""Injected staleness (`stale_inject: K`, docs/ALGORITHMS.md 8.2b): a delay line of gathered
steps at the learner, so that each step trains the groups gathered K steps before.

The first step of a run (or of a resume) gathers K + 1 steps' groups with its weights (admission
lets them out: its bound is raised by K), every later step one more, and each step trains the
oldest. So the first K steps train the start's data at staleness 0, 1, .. K - 1, and from then on
every group trains K versions after the step that gathered it. The groups in the line stay
pending in the coordinator until they are trained: a checkpoint keeps their prompts, and a
resume fills the line anew.
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


class DelayLine:
    def __init__(self, k: int, gather: Callable[[], GatheredStep],
                 trained: Callable[[list[str]], None]):
        self.k, self.gather, self.trained = k, gather, trained
        self.line: deque[GatheredStep] = deque()

    def waiting_groups(self) -> int:
        """Groups gathered and not yet trained (summary.json's count when the run ends)."""
        return sum(len(step.generated) for step in self.line)

    def next(self, version: int) -> GatheredStep:
        t0 = time.time()
        while len(self.line) <= self.k:
            self.line.append(self.gather())
        step = self.line.popleft()
        self.trained([g.group_id for g in [*step.generated, *step.dropped]])
        step.info = {**step.info, "perf/learner_idle_s": time.time() - t0,
                     "stale/injected": version - step.version,
                     "stale/line_groups": self.waiting_groups()}
        return step
