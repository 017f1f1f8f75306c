"""Rollout allocation rules: HORA (ALGORITHMS.md §7) and AERO strata and curation (§4.2, §4.4).

What: HORA's Beta-Bernoulli hit utility and the greedy allocation that maximises total hit
utility under a rollout budget; AERO's stratum of a prompt after exploration and the indices of
a group it keeps for training. Why: these decide where rollout compute goes; as pure functions
of counts (and an explicit `random.Random`) they are checked against brute force and by hand.

Run the tests with: .venv/bin/python -m pytest tests/test_allocation.py
"""

from __future__ import annotations

import heapq
import math
import random


def _log_miss(c: float, f: float, k: int) -> float:
    """log E[(1-p)^k] for p ~ Beta(1+c, 1+f): log prod_{j<k} (b+j)/(a+b+j) via lgamma, O(1)."""
    if c < 0 or f < 0 or k < 0:
        raise ValueError(f"need c, f, k >= 0, got c={c}, f={f}, k={k}")
    a, b = 1.0 + c, 1.0 + f
    return math.lgamma(b + k) - math.lgamma(b) + math.lgamma(a + b) - math.lgamma(a + b + k)


def hit_utility(c: float, f: float, k: int) -> float:
    """h(k) = P(at least one of k more rollouts is correct) = 1 - E[(1-p)^k] (§7.2).

    Posterior Beta(1 + c, 1 + f) under the uniform prior; c, f = observed correct/incorrect
    counts (may be decayed, hence float).
    """
    return -math.expm1(_log_miss(c, f, k))


def marginal_gain(c: float, f: float, k: int) -> float:
    """Delta(k) = h(k+1) - h(k) = E[p (1-p)^k] = E[(1-p)^k] * a / (a + b + k) (§7.2).

    Delta(k+1)/Delta(k) = (b+k)/(a+b+k+1) < 1, so h is concave and greedy is optimal.
    """
    a, b = 1.0 + c, 1.0 + f
    return math.exp(_log_miss(c, f, k)) * a / (a + b + k)


def hora_allocate(
    counts: list[tuple[float, float]], budget: int, k_min: int = 2, k_max: int = 64
) -> list[int]:
    """Rollouts per prompt maximising sum_q h_q(k_q) s.t. sum k_q = budget, k_min <= k_q <= k_max.

    counts: (c_q, f_q) per prompt. Greedy marginal allocation is optimal for this separable
    concave integer problem (§7.2-7.3 [I, derived]); ties go to the earlier prompt. The total is
    exactly `budget` when k_min*n <= budget <= k_max*n; above that every prompt gets k_max.
    Raises ValueError when the budget cannot give every prompt k_min (k_min = 2: a group needs
    a baseline).
    """
    if not 0 <= k_min <= k_max:
        raise ValueError(f"need 0 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
    n = len(counts)
    if budget < k_min * n:
        raise ValueError(
            f"budget {budget} is below k_min * prompts = {k_min} * {n} = {k_min * n}"
        )
    alloc = [k_min] * n
    left = budget - k_min * n
    heap = [(-marginal_gain(c, f, k_min), q) for q, (c, f) in enumerate(counts) if k_min < k_max]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, q = heapq.heappop(heap)
        alloc[q] += 1
        left -= 1
        if alloc[q] < k_max:
            c, f = counts[q]
            heapq.heappush(heap, (-marginal_gain(c, f, alloc[q]), q))
    return alloc


def aero_stratum(correct: int, n_explore: int, rescue_threshold: int = 0, tau: float = 0.5) -> str:
    """AERO stratum after exploration, u = correct / n_explore (§4.2):
    "rescue" if u <= S / n_explore, "low" if S / n_explore < u < tau, else "high" (incl. u = 1).

    rescue_threshold S lies in [0, n_explore / 2] [R:S4]; the paper uses S = 0 (all-fail).
    Compared in counts, not floats, so u = tau lands in "high" exactly.
    """
    if n_explore < 1 or not 0 <= correct <= n_explore:
        raise ValueError(f"need n_explore >= 1 and 0 <= correct <= n_explore, got {correct}, {n_explore}")
    if not 0 <= 2 * rescue_threshold <= n_explore:
        raise ValueError(f"rescue_threshold must be in [0, n_explore/2], got {rescue_threshold}")
    if correct <= rescue_threshold:
        return "rescue"
    if correct < tau * n_explore:
        return "low"
    return "high"


def aero_curate(
    accs: list[bool], stratum: str, rng: random.Random, k: int = 1, n_keep_degenerate: int = 4
) -> list[int]:
    """Sorted indices of a group's rollouts kept for training (§4.4).

    - degenerate (all-fail or all-correct over every rollout generated this step): a uniform
      random n_keep_degenerate of them (their advantages come from the Bayesian smoothing of
      learner/advantages.py);
    - "rescue" (now rescued) or "low": all c correct plus k*c uniformly random incorrect
      ("most informative" has no stated criterion; random avoids selection bias, §4.4 [I]);
    - "high": all (down-sampling them hurt in the paper [R:S4]).
    """
    if stratum not in ("rescue", "low", "high"):
        raise ValueError(f"stratum must be 'rescue', 'low' or 'high', got {stratum!r}")
    n = len(accs)
    pos = [i for i, a in enumerate(accs) if a]
    neg = [i for i, a in enumerate(accs) if not a]
    if not pos or not neg:
        return sorted(rng.sample(range(n), min(n_keep_degenerate, n)))
    match stratum:
        case "rescue" | "low":
            return sorted(pos + rng.sample(neg, min(k * len(pos), len(neg))))
        case _:
            return list(range(n))
