"""Evaluation estimators (tasks/eval_math.py, docs/ALGORITHMS.md §10)."""

from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.eval_math import avg_at_k, pass_at_k


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 64), data=st.data())
def test_pass_at_n_with_n_samples_is_one_if_any_is_correct(n, data):
    c = data.draw(st.integers(0, n))
    assert pass_at_k(n, c, n) == float(c >= 1)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 60), data=st.data())
def test_pass_at_k_matches_the_binomial_formula(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_one_is_the_fraction_correct():
    assert pass_at_k(16, 4, 1) == pytest.approx(0.25)


def test_pass_at_k_is_stable_for_large_n():
    value = pass_at_k(10_000, 3, 100)
    assert 0.0 < value < 1.0 and value == pytest.approx(1 - comb(9997, 100) / comb(10_000, 100))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_avg_at_k_is_the_mean_per_sample_accuracy():
    assert avg_at_k([8, 0, 4], k=8) == pytest.approx(0.5)


def test_avg_at_k_rejects_counts_above_k_and_empty_input():
    with pytest.raises(ValueError):
        avg_at_k([9], k=8)
    with pytest.raises(ValueError):
        avg_at_k([], k=8)
