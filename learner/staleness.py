"""Staleness rules for asynchronous training (docs/ALGORITHMS.md §8.1-8.2).

What: the admission rule the coordinator applies before handing out a prompt, the consumption
rule for samples that still came back staler than the bound, and the `stale/*` metrics (§9).
Why: the bound eta = max_staleness (AReaL's max_head_offpolicyness) limits off-policyness at
admission; a group that still outlives it (a long answer, a late sampling stage) is by default
trained under the truncated behaviour weight, as in AReaL and PipelineRL, since dropping it would
filter by length and difficulty; eta = 0 reproduces synchronous training. Staleness is
lambda = v_learner - v_behaviour in policy versions (one version per optimizer step).

Run the tests with: .venv/bin/python -m pytest tests/test_staleness.py
"""

from __future__ import annotations

import bisect
import math


def may_admit(n_submitted: int, learner_version: int, max_staleness: int, groups_per_step: int) -> bool:
    """Admission (§8.2 [I, modelled on AReaL]): submit one more group only if
    n_submitted + 1 <= (learner_version + max_staleness + 1) * groups_per_step.

    n_submitted counts groups handed out over the whole run. With max_staleness = 0 at most one
    step's groups are out at a time, which is the synchronous schedule.
    """
    if max_staleness < 0 or groups_per_step < 1:
        raise ValueError(
            f"need max_staleness >= 0 and groups_per_step >= 1, got {max_staleness}, {groups_per_step}"
        )
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
        raise ValueError(f"staleness must be >= 0 (behaviour version ahead of the learner?), got {staleness}")
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


def _quantile(sorted_values: list[int], cum_weights: list[int], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of the multiset in which sorted_values[j]
    occurs with the integer multiplicity implied by cum_weights, without expanding it."""
    pos = q * (cum_weights[-1] - 1)
    lo, hi = math.floor(pos), math.ceil(pos)

    def at(rank: int) -> int:  # value at 0-based rank of the expanded, sorted multiset
        return sorted_values[bisect.bisect_right(cum_weights, rank)]

    return at(lo) + (at(hi) - at(lo)) * (pos - lo)


def staleness_summary(
    values: list[int], max_staleness: int, weights: list[int] | None = None
) -> dict[str, float | list[int]]:
    """`stale/*` metrics (§9): mean, p50, p90, max and a histogram.

    values: staleness per sample (or per token). weights: optional integer multiplicities, e.g.
    each sample's loss-token count, so the summary is "over tokens in the loss" (§9) without a
    list entry per token. The histogram has bins 0..max_staleness plus one overflow bin for
    values above the bound. An empty input gives zeros and an all-zero histogram.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    w = [1] * len(values) if weights is None else list(weights)
    if len(w) != len(values):
        raise ValueError(f"weights has {len(w)} entries for {len(values)} values")
    if any(v < 0 for v in values) or any(x < 0 for x in w):
        raise ValueError("staleness values and weights must be >= 0")
    hist = [0] * (max_staleness + 2)
    counts: dict[int, int] = {}
    for v, x in zip(values, w):
        hist[min(v, max_staleness + 1)] += x
        counts[v] = counts.get(v, 0) + x
    pairs = sorted((v, x) for v, x in counts.items() if x > 0)
    if not pairs:
        return {"stale/mean": 0.0, "stale/p50": 0.0, "stale/p90": 0.0, "stale/max": 0.0, "stale/hist": hist}
    sorted_values, cum, total = [], [], 0
    for v, x in pairs:
        total += x
        sorted_values.append(v)
        cum.append(total)
    return {
        "stale/mean": sum(v * x for v, x in pairs) / total,
        "stale/p50": float(_quantile(sorted_values, cum, 0.5)),
        "stale/p90": float(_quantile(sorted_values, cum, 0.9)),
        "stale/max": float(sorted_values[-1]),
        "stale/hist": hist,
    }
