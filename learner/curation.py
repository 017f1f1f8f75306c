"""Per-group rules between a scored group and the loss: reward shaping, AERO curation, rescue.

What: DAPO's signed reward and overlong shaping (docs/ALGORITHMS.md 2), AERO's strata (4.2) and its
choice of the rollouts a group trains on and their advantages (4.3-4.4), and which prompts needed
and got a rescue (AR3PO stages after the first, AERO rounds; `rescue/*` of section 9).
Why: pure functions of one group's rewards, correctness, lengths and stages (plus an explicit
`random.Random`), so learner/algorithms.py composes them and the tests check them by hand.

Run the tests with: .venv/bin/python -m pytest tests/test_curation.py tests/test_algorithms.py
"""

from __future__ import annotations

import random

from learner.advantages import bayesian_degenerate_advantages
from learner.group_metrics import group_advantages
from learner.losses import dapo_overlong_penalty
from protocol.config.algorithms import AEROConfig, DAPOConfig
from protocol.config import LossConfig


def shaped_reward(reward: float, length: int, dapo: DAPOConfig, max_new_tokens: int) -> float:
    """The reward the loss sees: the reward function's (0/1 under the built-in math reward),
    with DAPO's signed reward mapped by 2r - 1 (0/1 -> -1/+1), plus, with overlong shaping,
    DAPO's soft penalty for the last `cache_frac` of the generation budget."""
    reward = 2.0 * reward - 1.0 if dapo.signed_reward else float(reward)
    if dapo.overlong == "shaping":
        cache = round(dapo.cache_frac * max_new_tokens)
        reward += dapo_overlong_penalty(length, max_new_tokens, cache, dapo.phi)
    return reward


def first_stage_counts(accs: list[bool], stages: list[int]) -> tuple[int, int]:
    """(correct, total) among the responses of the first stage (AERO: exploration)."""
    first = [a for a, s in zip(accs, stages) if s == 0]
    return sum(first), len(first)


def rescue_outcome(accs: list[bool], stages: list[int], threshold: int = 0) -> int | None:
    """For a prompt that needed a rescue (at most `threshold` correct in the first stage): the
    stage (AERO: round) of its first later correct response, 0 if none came. None when the
    prompt did not need a rescue."""
    correct, _ = first_stage_counts(accs, stages)
    if correct > threshold:
        return None
    later = [s for a, s in zip(accs, stages) if a and s > 0]
    return min(later) if later else 0


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


def aero_select(accs: list[bool], stages: list[int], rewards: list[float], aero: AEROConfig,
                loss_cfg: LossConfig, rng: random.Random) -> tuple[list[int], list[float], str]:
    """AERO curation of one group (4.3-4.4): (kept indices, their advantages, stratum).

    The stratum comes from the first stage's success rate; an all-fail or all-correct group
    (over every rollout generated this step) keeps `keep_degenerate` rollouts with Beta-posterior
    advantages over all of them; rescued and low-success groups keep every correct rollout and
    k per correct of the incorrect ones; high-success groups keep all. Advantages of curated
    mixed groups are computed on the kept rollouts (the theorem is stated on the curated set).
    """
    correct, explored = first_stage_counts(accs, stages)
    threshold = min(aero.rescue_threshold, explored // 2)
    stratum = aero_stratum(correct, explored, threshold, aero.tau)
    keep = aero_curate(accs, stratum, rng, aero.negatives_per_positive, aero.keep_degenerate)
    c_obs, n_obs = sum(accs), len(accs)
    if c_obs in (0, n_obs):
        adv = bayesian_degenerate_advantages([accs[i] for i in keep], c_obs, n_obs,
                                             aero.prior_alpha, aero.prior_beta,
                                             aero.advantage_form).tolist()
    else:
        adv = group_advantages([rewards[i] for i in keep], loss_cfg)
    return keep, adv, stratum
