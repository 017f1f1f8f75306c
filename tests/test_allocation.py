"""HORA allocation, one phase and two (actors/allocation.py, docs/ALGORITHMS.md §7)."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.allocation import hit_utility, hora_allocate, hora_second_phase, marginal_gain

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


# -- two-phase: the rest after a probe of k_min (§7.3 two_phase) -----------------------------


@settings(max_examples=80, deadline=None)
@given(stats=counts, data=st.data())
def test_the_second_phase_gives_nothing_to_a_prompt_whose_probe_hit(stats, data):
    probe_n = data.draw(st.integers(1, 4))
    hits = data.draw(st.lists(st.integers(0, probe_n), min_size=len(stats), max_size=len(stats)))
    budget, k_max = data.draw(st.integers(0, 40)), data.draw(st.integers(0, 12))
    rest = hora_second_phase(stats, hits, probe_n, budget, k_max)
    missed = [q for q, h in enumerate(hits) if h == 0]
    assert all(rest[q] == 0 for q, h in enumerate(hits) if h > 0)
    assert all(0 <= k <= k_max for k in rest)
    # the budget is spent up to what the missed prompts can take, never beyond
    assert sum(rest) == min(budget, k_max * len(missed))


@settings(max_examples=60, deadline=None)
@given(stats=st.lists(st.tuples(count, count), min_size=1, max_size=4), data=st.data())
def test_the_second_phase_is_optimal_against_brute_force_under_the_probed_posterior(stats, data):
    probe_n = data.draw(st.integers(1, 3))
    hits = data.draw(st.lists(st.integers(0, 1), min_size=len(stats), max_size=len(stats)))
    missed = [q for q, h in enumerate(hits) if h == 0]
    k_max = data.draw(st.integers(1, 4))
    budget = data.draw(st.integers(0, k_max * len(missed)))
    rest = hora_second_phase(stats, hits, probe_n, budget, k_max)

    def utility(ks):  # hit utility of the rest, under the posterior after the probe
        return sum(hit_utility(stats[q][0], stats[q][1] + probe_n, ks[i])
                   for i, q in enumerate(missed))

    best = max((ks for ks in itertools.product(range(k_max + 1), repeat=len(missed))
                if sum(ks) == budget), key=utility, default=())
    assert utility([rest[q] for q in missed]) == pytest.approx(utility(best), abs=1e-12)


def test_a_probe_without_a_hit_makes_a_prompt_look_harder_and_moves_budget_to_it():
    # two unseen prompts, both missed by a probe of 2, the second also failed 6 times before:
    # the fresher one is likelier to hit, so it gets more of the rest
    rest = hora_second_phase([(0, 0), (0, 6)], [0, 0], 2, budget=6, k_max=30)
    assert sum(rest) == 6 and rest[0] > rest[1]
    # when every probe hit, nothing more is sampled (residual utility 0 everywhere)
    assert hora_second_phase([(0, 0), (3, 1)], [1, 2], 2, budget=12, k_max=30) == [0, 0]


def test_the_second_phase_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="one probe count per prompt"):
        hora_second_phase([(0, 0)], [0, 0], 2, 4, 4)
