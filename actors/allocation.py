"""HORA's rollout allocation (docs/ALGORITHMS.md §7): where a work item's responses go.

What: the Beta-Bernoulli hit utility, the greedy allocation that maximises total hit utility
under a rollout budget (one phase), and the second phase of the `two_phase` variant (after a
probe of k_min per prompt, the rest goes greedily to the prompts whose probe has no hit; a hit
leaves a prompt residual utility 0). Why here, at the actor: the two-phase variant allocates from
the probe's rewards, which only the actor has before the group is sent; the learner sends each
prompt's posterior counts with it (Prompt.prior_correct / prior_incorrect), so both variants
allocate in one place. Pure functions of counts, checked against brute force and by hand.

Run the tests with: .venv/bin/python -m pytest tests/test_allocation.py
"""

from __future__ import annotations

import heapq
import math


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


def hora_second_phase(counts: list[tuple[float, float]], probe_correct: list[int], probe_n: int,
                      budget: int, k_max: int) -> list[int]:
    """Responses each prompt gets after the probe (`two_phase`, §7.3): 0 for a prompt whose
    probe holds a correct response (residual hit utility 0: a hit is what the allocation buys),
    and the greedy hit-utility allocation of `budget` over the others, each under its posterior
    updated with the probe, Beta(1 + c, 1 + f + probe_n), and capped at `k_max` (the per-prompt
    cap less the probe). Budget the capped prompts cannot take is not spent (not carried over).

    counts: (c_q, f_q) before the probe; probe_correct: correct responses among each prompt's
    `probe_n` probe responses."""
    if len(probe_correct) != len(counts) or budget < 0 or probe_n < 0 or k_max < 0:
        raise ValueError(f"need one probe count per prompt and budget, probe_n, k_max >= 0, got "
                         f"{len(probe_correct)} for {len(counts)}, {budget}, {probe_n}, {k_max}")
    missed = [q for q, hits in enumerate(probe_correct) if hits == 0]
    rest = [0] * len(counts)
    if not missed or k_max == 0:
        return rest
    posterior = [(counts[q][0], counts[q][1] + probe_n) for q in missed]
    for q, k in zip(missed, hora_allocate(posterior, min(budget, k_max * len(missed)), 0, k_max)):
        rest[q] = k
    return rest
