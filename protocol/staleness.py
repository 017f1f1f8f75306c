"""How old the data a run trains on may be, in one value (docs/ALGORITHMS.md 8.1-8.2).

What: `Staleness` holds the bound the mode sets (`max_staleness` in async, 0 in sync,
`mugrpo.updates_per_stage - 1` in staged), the delay `stale_inject` adds, and what happens to a
group that still comes back staler than the bound (`stale_policy`, `stale_downweight`);
`Config.staleness` builds it. The coordinator admits work by it, the trainer drops and counts
what outlived the bound by it, the algorithms scale a group's loss by it, and `rlvr plan`
simulates the same rules with it.
Why: the bound eta limits off-policyness at admission (AReaL's max_head_offpolicyness); a group
that still outlives it (a long answer, a late sampling stage) is by default trained under the
truncated behaviour weight, as in AReaL and PipelineRL, since dropping it would filter by length
and difficulty; eta = 0 reproduces synchronous training. Staleness is lambda = v_learner -
v_behaviour in policy versions (one version per learner step); a group's is its oldest sample's.

Run the tests with: .venv/bin/python -m pytest tests/test_staleness.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.messages import Group


@dataclass(frozen=True)
class Staleness:
    bound: int
    """Versions a group may lag the learner when it is gathered: the mode's bound."""
    inject: int = 0
    """stale_inject K: every gathered group waits K more versions at the learner."""
    policy: Literal["tis", "downweight", "drop"] = "tis"
    """What a group gathered staler than the bound gets: trained under the truncated behaviour
    weight (tis), trained with its loss scaled down (downweight) or dropped (drop)."""
    downweight: float = 0.5
    """Under downweight: the loss factor per version over the bound."""

    @property
    def admitted(self) -> int:
        """The staleness admission hands work out to, and within which a group trains at full
        weight: the bound plus the injected delay (the actors may run K steps further ahead)."""
        return self.bound + self.inject

    def may_admit(self, n_submitted: int, learner_version: int, groups_per_step: int,
                  bound: int | None = None) -> bool:
        """Whether one more group may be handed out (`bound` replaces the admitted staleness for
        one call: a Mu-GRPO stage admits its steps' groups at once)."""
        return may_admit(n_submitted, learner_version,
                         self.admitted if bound is None else bound, groups_per_step)

    def over_bound(self, age: int) -> bool:
        """Gathered staler than the bound: dropped under `drop`, else trained and counted."""
        return age > self.bound

    def dropped(self, age: int) -> bool:
        """Thrown away when gathered (its slot goes to another prompt)."""
        return self.policy == "drop" and self.over_bound(age)

    def loss_scale(self, age: int) -> float:
        """A group's loss factor when trained `age` versions after it was sampled."""
        return staleness_weight(age, self.admitted, self.policy, self.downweight) or 0.0


def age(group: Group, version: int) -> int:
    """A group's staleness at learner `version`: that of its oldest sample."""
    return version - min(s.policy_version for s in group.samples)


def may_admit(n_submitted: int, learner_version: int, max_staleness: int,
              groups_per_step: int) -> bool:
    """Admission (§8.2 [I, modelled on AReaL]): submit one more group only if
    n_submitted + 1 <= (learner_version + max_staleness + 1) * groups_per_step.

    n_submitted counts groups handed out over the whole run. With max_staleness = 0 at most one
    step's groups are out at a time, which is the synchronous schedule.
    """
    if max_staleness < 0 or groups_per_step < 1:
        raise ValueError(f"need max_staleness >= 0 and groups_per_step >= 1, got {max_staleness}, "
                         f"{groups_per_step}")
    return n_submitted + 1 <= (learner_version + max_staleness + 1) * groups_per_step


def staleness_weight(
    staleness: int, max_staleness: int, policy: str, gamma: float = 0.5
) -> float | None:
    """Consumption rule (§8.2 [I]): loss weight of a sample, or None to drop it.

    Within the bound the weight is 1. Beyond it:
      "drop": None;  "downweight": gamma ** (staleness - max_staleness);
      "tis" (default): 1, relying on the truncated behaviour weight of §8.3 (learner/losses.py).
    """
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0 (behaviour version ahead of the learner?), "
                         f"got {staleness}")
    if policy not in ("drop", "downweight", "tis"):
        raise ValueError(f"policy must be 'drop', 'downweight' or 'tis', got {policy!r}")
    if staleness <= max_staleness:
        return 1.0
    match policy:
        case "drop":
            return None
        case "downweight":
            return gamma ** (staleness - max_staleness)
        case _:
            return 1.0
