"""AERO's strata and curation (learner/curation.py, docs/ALGORITHMS.md §4.2, §4.4)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.curation import aero_curate, aero_stratum


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
