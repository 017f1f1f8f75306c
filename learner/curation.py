"""Per-group rules between a scored group and the loss: reward shaping, AERO curation, rescue.

What: DAPO's signed reward and overlong shaping (ALGORITHMS.md 2), AERO's choice of the rollouts
a group trains on and their advantages (4.3-4.4), and which prompts needed and got a rescue
(AR3PO stages after the first, AERO rounds; `rescue/*` of section 9).
Why: pure functions of one group's rewards, correctness, lengths and stages (plus an explicit
`random.Random`), so learner/algorithms.py composes them and the tests check them by hand.

Run the tests with: .venv/bin/python -m pytest tests/test_curation.py
"""

from __future__ import annotations

import random

from learner.allocation import aero_curate, aero_stratum
from learner.advantages import bayesian_degenerate_advantages
from learner.groups import group_advantages
from learner.losses import dapo_overlong_penalty
from protocol.algorithm_config import AEROConfig, DAPOConfig
from protocol.config import LossConfig


def shaped_reward(acc: bool, length: int, dapo: DAPOConfig, max_new_tokens: int) -> float:
    """The reward the loss sees: 0/1 (DAPO: -1/+1) plus, with overlong shaping, DAPO's soft
    penalty for the last `cache_frac` of the generation budget."""
    reward = (1.0 if acc else -1.0) if dapo.signed_reward else float(acc)
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
