"""Evaluation estimators (docs/ALGORITHMS.md §10): unbiased pass@k and avg@k.

Why the product form: 1 - C(n-c, k) / C(n, k) overflows or loses precision for large n, while
1 - prod_{i=n-c+1}^{n} (1 - k/i) stays in [0, 1] [K:Chen et al. 2021].

Run the tests with: .venv/bin/python -m pytest tests/test_eval_math.py
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c correct (needs 1 <= k <= n).

    Equals 1 when n - c < k; with n == k it reduces to 1[c >= 1] (AERO's Pass@n [R:S4 B.2.1]).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(correct_counts: Sequence[int], k: int) -> float:
    """Avg@k = mean over problems of c_j / k, each problem with exactly k samples (§10)."""
    if k < 1 or not correct_counts:
        raise ValueError(f"need k >= 1 and at least one problem, got k={k}, {len(correct_counts)} problems")
    if any(not 0 <= c <= k for c in correct_counts):
        raise ValueError(f"every correct count must lie in [0, k={k}]")
    return sum(correct_counts) / (k * len(correct_counts))
