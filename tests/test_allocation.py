"""HORA allocation and AERO strata/curation (learner/allocation.py, ALGORITHMS.md §7, §4.2, §4.4)."""

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.allocation import aero_curate, aero_stratum, hit_utility, hora_allocate, marginal_gain

count = st.floats(0, 50, allow_nan=False)
counts = st.lists(st.tuples(count, count), min_size=1, max_size=6)


def spec_delta(c, f, k):
    """The spec's reference `delta` (§7.3), a plain product."""
    a, b = 1 + c, 1 + f
    return math.exp(sum(math.log((b + j) / (a + b + j)) for j in range(k))) * a / (a + b + k)


# -- hit utility (§7.2) -----------------------------------------------------------------------


def test_under_a_uniform_posterior_k_rollouts_hit_with_probability_k_over_k_plus_one():
    assert [hit_utility(0, 0, k) for k in range(5)] == pytest.approx([0, 1 / 2, 2 / 3, 3 / 4, 4 / 5])


@settings(max_examples=80, deadline=None)
@given(c=count, f=count, k=st.integers(0, 100))
def test_marginal_gain_is_the_difference_of_hit_utilities_and_matches_the_spec(c, f, k):
    assert marginal_gain(c, f, k) == pytest.approx(hit_utility(c, f, k + 1) - hit_utility(c, f, k), rel=1e-6, abs=1e-12)
    assert marginal_gain(c, f, k) == pytest.approx(spec_delta(c, f, k), rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(c=count, f=count, k=st.integers(0, 100))
def test_hit_utility_is_increasing_and_concave(c, f, k):
    assert 0.0 <= hit_utility(c, f, k) <= hit_utility(c, f, k + 1) <= 1.0
    assert marginal_gain(c, f, k + 1) < marginal_gain(c, f, k)


# -- HORA greedy allocation (§7.3) ------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(stats=counts, data=st.data())
def test_allocation_spends_exactly_the_budget_within_the_box(stats, data):
    k_min, k_max = 2, data.draw(st.integers(2, 16))
    budget = data.draw(st.integers(k_min * len(stats), k_max * len(stats)))
    alloc = hora_allocate(stats, budget, k_min, k_max)
    assert sum(alloc) == budget
    assert all(k_min <= k <= k_max for k in alloc)


@settings(max_examples=60, deadline=None)
@given(stats=st.lists(st.tuples(count, count), min_size=1, max_size=3), data=st.data())
def test_greedy_allocation_is_optimal_against_brute_force_on_tiny_cases(stats, data):
    k_min, k_max = data.draw(st.integers(0, 2)), data.draw(st.integers(2, 6))
    budget = data.draw(st.integers(k_min * len(stats), k_max * len(stats)))

    def total(alloc):
        return sum(hit_utility(c, f, k) for (c, f), k in zip(stats, alloc))

    feasible = [a for a in itertools.product(range(k_min, k_max + 1), repeat=len(stats)) if sum(a) == budget]
    best = max(total(a) for a in feasible)
    assert total(hora_allocate(stats, budget, k_min, k_max)) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_uncertain_prompts_get_more_than_saturated_or_hopeless_ones():
    saturated, hopeless, uncertain = (100, 0), (0, 100), (1, 1)
    alloc = hora_allocate([saturated, hopeless, uncertain], budget=12)
    assert alloc[2] > alloc[0] and alloc[2] > alloc[1]


def test_a_budget_beyond_the_caps_gives_every_prompt_k_max():
    assert hora_allocate([(0, 0), (1, 3)], budget=100, k_min=2, k_max=8) == [8, 8]


def test_a_budget_below_k_min_per_prompt_is_rejected_naming_the_problem():
    with pytest.raises(ValueError, match=r"budget 5 is below k_min \* prompts"):
        hora_allocate([(0, 0)] * 3, budget=5, k_min=2)


def test_no_prompts_get_no_rollouts():
    assert hora_allocate([], budget=0) == []


# -- AERO strata (§4.2) -----------------------------------------------------------------------


def test_strata_with_the_paper_settings():
    strata = [aero_stratum(c, n_explore=8) for c in range(9)]
    assert strata == ["rescue", "low", "low", "low", "high", "high", "high", "high", "high"]


def test_a_rescue_threshold_widens_the_rescue_stratum():
    assert [aero_stratum(c, 8, rescue_threshold=2) for c in (2, 3)] == ["rescue", "low"]


def test_strata_reject_out_of_range_inputs():
    with pytest.raises(ValueError, match="rescue_threshold"):
        aero_stratum(0, 8, rescue_threshold=5)
    with pytest.raises(ValueError, match="correct"):
        aero_stratum(9, 8)


# -- AERO curation (§4.4) ---------------------------------------------------------------------


def test_degenerate_groups_keep_a_random_four():
    rng = random.Random(0)
    kept = aero_curate([False] * 16, "rescue", rng)
    assert len(kept) == 4 and kept == sorted(set(kept))
    assert len(aero_curate([True] * 8, "high", rng)) == 4
    assert aero_curate([False] * 3, "rescue", rng) == [0, 1, 2]


def test_a_rescued_group_trains_on_one_correct_and_one_incorrect():
    accs = [False] * 9 + [True]
    kept = aero_curate(accs, "rescue", random.Random(0))
    assert len(kept) == 2 and 9 in kept


def test_high_success_groups_are_not_down_sampled():
    accs = [True, True, True, True, True, False, False, False]
    assert aero_curate(accs, "high", random.Random(0)) == list(range(8))


@settings(max_examples=60, deadline=None)
@given(accs=st.lists(st.booleans(), min_size=2, max_size=32), k=st.integers(1, 3), seed=st.integers(0, 1000))
def test_low_stratum_keeps_all_correct_and_k_times_as_many_incorrect(accs, k, seed):
    c, f = sum(accs), len(accs) - sum(accs)
    kept = aero_curate(accs, "low", random.Random(seed), k=k)
    assert kept == sorted(set(kept)) and all(0 <= i < len(accs) for i in kept)
    if 0 < c < len(accs):
        assert sum(accs[i] for i in kept) == c
        assert sum(not accs[i] for i in kept) == min(k * c, f)
    else:
        assert len(kept) == min(4, len(accs))


def test_curation_is_reproducible_from_the_rng_seed():
    accs = [True] + [False] * 15
    assert aero_curate(accs, "low", random.Random(3)) == aero_curate(accs, "low", random.Random(3))
    with pytest.raises(ValueError, match="stratum"):
        aero_curate(accs, "medium", random.Random(3))
