"""Staleness admission, consumption and metrics (learner/staleness.py, docs/ALGORITHMS.md §8.1-8.2, §9)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.staleness import staleness_summary
from protocol.staleness import may_admit, staleness_weight


def run_admission(eta: int, per_step: int, versions: int) -> list[int]:
    """A learner that, at each version v, admits what `may_admit` lets out and then trains step
    v's groups (indices v*G .. (v+1)*G - 1, in order); returns the version each group was
    admitted at, and checks the learner never waits for a group admission holds back."""
    admitted_at: list[int] = []
    for v in range(versions):
        while may_admit(len(admitted_at), v, eta, per_step):
            admitted_at.append(v)
        assert len(admitted_at) >= (v + 1) * per_step, f"step {v} starved at eta={eta}"
    return admitted_at


def test_the_synchronous_bound_hands_out_exactly_the_step_being_trained():
    admitted_at = run_admission(eta=0, per_step=4, versions=3)
    assert admitted_at == [0] * 4 + [1] * 4 + [2] * 4  # each step's groups, with its weights


@settings(max_examples=60, deadline=None)
@given(eta=st.integers(0, 8), per_step=st.integers(1, 64), versions=st.integers(1, 12))
def test_every_group_is_trained_within_eta_versions_of_its_admission_and_eta_steps_run_ahead(
        eta, per_step, versions):
    admitted_at = run_admission(eta, per_step, versions)
    for i, a in enumerate(admitted_at[:versions * per_step]):
        assert i // per_step - a <= eta  # trained by version i // G, admitted at version a
    # and as far ahead as the bound allows: eta whole steps beyond the one being trained
    assert len(admitted_at) == (versions + eta) * per_step


def test_admission_rejects_a_negative_bound():
    with pytest.raises(ValueError, match="max_staleness"):
        may_admit(0, 0, -1, 4)


@pytest.mark.parametrize("policy", ["drop", "downweight", "tis"])
def test_samples_within_the_bound_get_weight_one(policy):
    assert staleness_weight(0, 4, policy) == 1.0
    assert staleness_weight(4, 4, policy) == 1.0


def test_beyond_the_bound_drop_drops_downweight_halves_per_version_and_tis_keeps():
    assert staleness_weight(5, 4, "drop") is None
    assert staleness_weight(5, 4, "downweight") == 0.5
    assert staleness_weight(7, 4, "downweight", gamma=0.5) == 0.125
    assert staleness_weight(9, 4, "tis") == 1.0


def test_staleness_weight_rejects_unknown_policies_and_negative_staleness():
    with pytest.raises(ValueError, match="policy"):
        staleness_weight(0, 4, "clip")
    with pytest.raises(ValueError, match="staleness"):
        staleness_weight(-1, 4, "drop")


def test_summary_reports_mean_percentiles_max_and_a_histogram_with_overflow():
    s = staleness_summary([0, 0, 1, 2, 7], max_staleness=2)
    assert s["stale/mean"] == pytest.approx(2.0)
    assert s["stale/p50"] == 1.0 and s["stale/max"] == 7.0
    assert s["stale/hist"] == [2, 1, 1, 1]


def test_summary_of_nothing_is_zero_with_an_empty_histogram():
    s = staleness_summary([], max_staleness=1)
    assert s == {"stale/mean": 0.0, "stale/p50": 0.0, "stale/p90": 0.0, "stale/max": 0.0, "stale/hist": [0, 0, 0]}


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 20), min_size=1, max_size=40), eta=st.integers(0, 10))
def test_summary_percentiles_match_numpy(values, eta):
    s = staleness_summary(values, eta)
    assert s["stale/mean"] == pytest.approx(np.mean(values))
    assert s["stale/p50"] == pytest.approx(np.percentile(values, 50))
    assert s["stale/p90"] == pytest.approx(np.percentile(values, 90))
    assert s["stale/max"] == max(values)
    assert sum(s["stale/hist"]) == len(values) and len(s["stale/hist"]) == eta + 2


@settings(max_examples=60, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 6)), min_size=1, max_size=20))
def test_token_weights_equal_repeating_each_value_per_token(pairs):
    values, weights = [v for v, _ in pairs], [w for _, w in pairs]
    expanded = [v for v, w in pairs for _ in range(w)]
    assert staleness_summary(values, 4, weights=weights) == staleness_summary(expanded, 4)
