"""The `stale/*` metrics (docs/ALGORITHMS.md §9): how stale the trained tokens were, as mean,
quantiles, max and a histogram. The rules themselves (admission, the bound, the injected delay,
what happens to a group over the bound) are `protocol.staleness.Staleness`.

Run the tests with: .venv/bin/python -m pytest tests/test_staleness.py
"""

from __future__ import annotations

import bisect
import math


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
