"""Group advantages (learner/advantages.py, docs/ALGORITHMS.md §1.2, §4.3)."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from learner.advantages import (
    bayesian_degenerate_advantages,
    drgrpo_advantages,
    grpo_advantages,
    rloo_advantages,
)

ESTIMATORS = [
    pytest.param(lambda r: grpo_advantages(r), id="grpo-unbiased"),
    pytest.param(lambda r: grpo_advantages(r, std_mode="population"), id="grpo-population"),
    pytest.param(drgrpo_advantages, id="drgrpo"),
    pytest.param(rloo_advantages, id="rloo"),
]

reward = st.floats(-10, 10, allow_nan=False, allow_subnormal=False)
groups = st.lists(reward, min_size=2, max_size=16)


def spread(r):
    return max(r) - min(r)


# -- hand-computed cases from the spec -------------------------------------------------------


def test_one_correct_of_eight_gives_the_spec_values_with_unbiased_std():
    adv = grpo_advantages([1.0] + [0.0] * 7)
    assert adv[0].item() == pytest.approx(2.475, abs=1e-3)
    assert adv[1:].tolist() == pytest.approx([-0.354] * 7, abs=1e-3)


def test_one_correct_of_eight_gives_the_spec_values_with_population_std():
    adv = grpo_advantages([True] + [False] * 7, std_mode="population")
    assert adv[0].item() == pytest.approx(2.646, abs=1e-3)
    assert adv[1:].tolist() == pytest.approx([-0.378] * 7, abs=1e-3)


def test_advantages_are_float32_and_accept_lists_bools_and_tensors():
    as_list = grpo_advantages([1, 0, 0, 1])
    as_bools = grpo_advantages([True, False, False, True])
    as_tensor = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float16))
    assert as_list.dtype == torch.float32
    assert torch.equal(as_list, as_bools) and torch.equal(as_list, as_tensor)


def test_drgrpo_is_the_centred_reward_and_rloo_the_leave_one_out_difference():
    r = [1.0, 0.0, 0.0, 0.5]
    assert drgrpo_advantages(r).tolist() == pytest.approx([0.625, -0.375, -0.375, 0.125])
    loo = [r[i] - (sum(r) - r[i]) / 3 for i in range(4)]
    assert rloo_advantages(r).tolist() == pytest.approx(loo)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_a_singleton_group_gives_zero_advantage(estimator):
    assert estimator([1.0]).tolist() == [0.0]
    assert estimator([]).tolist() == []


def test_unknown_std_mode_is_rejected_by_name():
    with pytest.raises(ValueError, match="std_mode"):
        grpo_advantages([1.0, 0.0], std_mode="sample")


# -- properties -------------------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ESTIMATORS)
@settings(max_examples=60, deadline=None)
@given(value=reward, n=st.integers(2, 32))
def test_identical_rewards_give_exactly_zero_advantage(estimator, value, n):
    assert torch.count_nonzero(estimator([value] * n)) == 0


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("value", [0.1, 2.2, 1 / 3, -0.7])
def test_identical_non_representable_rewards_give_exactly_zero(estimator, value):
    assert torch.count_nonzero(estimator([value] * 7)) == 0
    assert torch.count_nonzero(estimator(torch.full((5,), value, dtype=torch.float32))) == 0


@pytest.mark.parametrize("estimator", ESTIMATORS)
@settings(max_examples=60, deadline=None)
@given(r=groups)
def test_group_advantages_sum_to_zero(estimator, r):
    adv = estimator(r)
    assert abs(adv.double().sum().item()) <= 1e-5 * (1 + adv.abs().sum().item())


@pytest.mark.parametrize("estimator", ESTIMATORS)
@settings(max_examples=60, deadline=None)
@given(r=groups, shift=st.floats(-100, 100, allow_nan=False))
def test_a_constant_reward_shift_changes_nothing(estimator, r, shift):
    assume(spread(r) > 1e-3)
    shifted = estimator([x + shift for x in r])
    assert torch.allclose(shifted, estimator(r), atol=1e-4, rtol=1e-4)


@settings(max_examples=60, deadline=None)
@given(r=groups)
def test_rloo_is_n_over_n_minus_one_times_drgrpo(r):
    n = len(r)
    assert torch.allclose(rloo_advantages(r), n / (n - 1) * drgrpo_advantages(r), atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(r=groups, scale=st.floats(0.1, 10))
def test_grpo_is_invariant_to_positive_reward_scaling(r, scale):
    assume(spread(r) > 1e-2)
    assert torch.allclose(grpo_advantages([x * scale for x in r]), grpo_advantages(r), atol=1e-3)


# -- AERO Bayesian smoothing (§4.3) ------------------------------------------------------------


@pytest.mark.parametrize("n_obs", [4, 8, 28, 32])
def test_all_fail_group_gets_minus_one_over_sqrt_n_plus_one(n_obs):
    adv = bayesian_degenerate_advantages([False] * 4, c_obs=0, n_obs=n_obs)
    assert adv.tolist() == pytest.approx([-1 / math.sqrt(n_obs + 1)] * 4, rel=1e-6)


@pytest.mark.parametrize("n_obs", [4, 8, 16])
def test_all_correct_group_gets_plus_one_over_sqrt_n_plus_one(n_obs):
    adv = bayesian_degenerate_advantages([True] * 4, c_obs=n_obs, n_obs=n_obs)
    assert adv.tolist() == pytest.approx([1 / math.sqrt(n_obs + 1)] * 4, rel=1e-6)


def test_spec_examples_all_correct_after_eight_and_unrescued_after_twenty_eight():
    assert bayesian_degenerate_advantages([1] * 4, 8, 8)[0].item() == pytest.approx(0.333, abs=1e-3)
    assert bayesian_degenerate_advantages([0] * 4, 0, 28)[0].item() == pytest.approx(-0.186, abs=1e-3)


def test_mean_only_form_has_magnitude_one_over_n_plus_two():
    adv = bayesian_degenerate_advantages([0, 0, 0, 0], c_obs=0, n_obs=8, form="mean_only")
    assert adv.tolist() == pytest.approx([-1 / 10] * 4)


def test_more_evidence_shrinks_the_push():
    few = bayesian_degenerate_advantages([0] * 4, 0, 8)[0].abs()
    many = bayesian_degenerate_advantages([0] * 4, 0, 32)[0].abs()
    assert many < few


def test_bayesian_smoothing_rejects_mixed_groups_and_bad_counts():
    with pytest.raises(ValueError, match="all-fail or all-correct"):
        bayesian_degenerate_advantages([1, 0], c_obs=1, n_obs=2)
    with pytest.raises(ValueError, match="c_obs"):
        bayesian_degenerate_advantages([0, 0], c_obs=3, n_obs=2)
    with pytest.raises(ValueError, match="form"):
        bayesian_degenerate_advantages([0, 0], c_obs=0, n_obs=2, form="median")
