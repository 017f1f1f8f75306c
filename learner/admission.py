"""Which prompts go out next: admission within the staleness bound (docs/ALGORITHMS.md 8.2).

A group is handed out only while `slots_taken + 1 <= (version + max_staleness + 1) *
groups_per_step` (protocol/staleness.py `Staleness.may_admit`), where `slots_taken` counts the
groups handed out less those released (dropped as stale, or a DAPO generation batch taken beyond
the first): a released group gives its admission slot to a replacement (AReaL's N_submitted).
Prompts of a lost actor are handed out again first, with their group ids and no new slot: they
were counted once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from protocol.messages import PROTOCOL_VERSION, Prompt, RolloutSpec, Work
from protocol.staleness import Staleness


class Admission:
    def __init__(self, prompts: Iterator[Prompt], rollout: RolloutSpec, groups_per_step: int,
                 prompts_per_work: int, staleness: Staleness, slots_taken: int = 0):
        self.prompts = prompts
        self.rollout = rollout
        self.groups_per_step = groups_per_step
        self.prompts_per_work = prompts_per_work
        self.staleness = staleness
        # groups handed out, less those released; a resumed run starts as if every earlier
        # step's groups had been handed out (version x groups_per_step)
        self.slots_taken = slots_taken
        self.reissue: deque[Prompt] = deque()  # prompts of lost actors, handed out first
        self._work_seq = 0

    def next_work(self, version: int, seen: set[str], bound: int | None = None) -> Work | None:
        """The next work item at policy `version`, or None while the bound admits nothing.
        Reissued prompts whose group is in `seen` are skipped: a lost actor that was only slow
        may have sent them since. `bound` replaces the admitted staleness (Coordinator.admit)."""
        self.reissue = deque(p for p in self.reissue if p.group_id not in seen)
        if self.reissue:
            prompts = [self.reissue.popleft()
                       for _ in range(min(len(self.reissue), self.prompts_per_work))]
        else:
            fresh = 0
            while (fresh < self.prompts_per_work and self.staleness.may_admit(
                    self.slots_taken + fresh, version, self.groups_per_step, bound)):
                fresh += 1
            if fresh == 0:
                return None
            prompts = [next(self.prompts) for _ in range(fresh)]
            self.slots_taken += fresh
        self._work_seq += 1
        return Work(protocol_version=PROTOCOL_VERSION, policy_version=version,
                    work_id=f"w{self._work_seq}", prompts=prompts, rollout=self.rollout)

    def release(self, groups: int) -> None:
        """Groups dropped (stale, or filtered by DAPO's dynamic sampling) free their slots."""
        self.slots_taken -= groups
