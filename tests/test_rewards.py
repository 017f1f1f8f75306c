"""Reward functions of the user's (`task.reward`): what they may return, what happens when they
misbehave (scored 0, counted, the first error logged once; the run and the child go on), and a
bad name refused before anything starts."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tasks.rewards import RewardError, Score, normalize, resolve
from tasks.verifier import Verifier


@pytest.mark.parametrize("value, expected", [
    (1.0, Score(1.0, True)),
    (0, Score(0.0, False)),
    (True, Score(1.0, True)),
    (-0.5, Score(-0.5, False)),
    (np.float32(0.25), Score(0.25, True)),
    ({"reward": 0.0, "acc": True, "len": 3}, Score(0.0, True, {"len": 3.0})),
    ({"reward": 2}, Score(2.0, True)),
])
def test_a_number_or_a_dict_with_reward_is_a_score(value, expected):
    assert normalize(value) == expected


@pytest.mark.parametrize("value, reason", [
    ("1", "not a finite number"),
    (float("nan"), "not a finite number"),
    (None, "not a finite number"),
    ({"acc": True}, "without 'reward'"),
    ({"reward": float("inf")}, "not a finite number"),
    ({"reward": 1, "len": "long"}, "'len'"),
    ({"reward": 1, "acc": "yes"}, "acc 'yes'"),
    ({"reward": 1, "errors": 2}, "reserved"),
])
def test_anything_else_scores_zero_with_the_reason(value, reason):
    score = normalize(value)
    assert (score.reward, score.acc) == (0.0, False) and reason in score.error


@pytest.mark.parametrize("ref, reason", [
    ("tests.reward_plugins", "not 'package.module:function'"),
    ("tests.no_such_module:f", "ModuleNotFoundError"),
    ("tests.reward_plugins:missing", "AttributeError"),
    ("tests.reward_plugins:NOT_A_FUNCTION", "not a function"),
    ("tests.reward_plugins:two_args", "must take (response, answer, fields)"),
])
def test_a_name_that_is_no_reward_function_is_refused_with_the_reason(ref, reason):
    with pytest.raises(RewardError, match=None) as e:
        resolve(ref)
    assert reason in str(e.value)
    with pytest.raises(RewardError):
        Verifier(reward=ref)  # before any child starts


def test_the_users_function_sees_the_response_and_the_fields_and_its_scores_come_back():
    with Verifier(timeout_s=5.0, reward="tests.reward_plugins:exact") as v:
        scores = v.judge(["so 12", "so 13"], ["12", "12"], [{"level": 2}, {}])
        assert scores == [Score(1.0, True, {"chars": 5.0, "level": 2.0}),
                          Score(0.0, False, {"chars": 5.0, "level": -1.0})]
        # no \boxed{} shortcut for a function of the user's: it judges every response
        assert v.score(["\\boxed{12}", "no box 12"], ["12", "12"]) == [False, True]
    with Verifier(timeout_s=5.0, reward="tests.reward_plugins:graded") as v:
        assert v.judge(["a 7", "a 8"], ["7", "7"]) == [Score(0.5, True), Score(0.0, False)]


def test_a_misbehaving_function_scores_zero_is_counted_and_the_rest_are_scored(caplog):
    cases = ["raise", "fine", "text", "nan", "no reward", "reserved", "sleep", "exit", "fine"]
    with (Verifier(timeout_s=0.5, reward="tests.reward_plugins:misbehaving") as v,
          caplog.at_level(logging.WARNING)):
        scores = v.judge(cases, ["1"] * len(cases))
        assert [s.reward for s in scores] == [0, 1, 0, 0, 0, 0, 0, 0, 1]
        assert [s.error is None for s in scores] == [c == "fine" for c in cases]
        assert "ValueError: no verdict for raise" in scores[0].error
        assert "timed out" in scores[6].error and "died" in scores[7].error
        assert v.errors == 7 and v.restarts == 1  # only the exit took the child down
        assert v.judge(["raise"], ["1"])[0].error  # a second error: counted, not logged again
        assert v.errors == 8
    logged = [r.getMessage() for r in caplog.records if "reward/errors" in r.getMessage()]
    assert len(logged) == 1 and "Traceback" in logged[0] and "no verdict for raise" in logged[0]


def test_a_weighted_sum_trains_on_the_sum_takes_acc_from_the_first_and_logs_each_term():
    spec = ("tests.reward_plugins:exact - tests.reward_plugins:graded"
            " + 0.5*tests.reward_plugins:brevity")
    with Verifier(timeout_s=5.0, reward=spec) as v:
        right, wrong = v.judge(["so 12", "so 1"], ["12", "12"], [{"level": 2}, {}])
    assert right.reward == pytest.approx(1.0 + 0.5 / 6 - 0.5) and right.acc
    assert right.scores == {"exact": 1.0, "exact/chars": 5.0, "exact/level": 2.0,
                            "brevity": pytest.approx(1 / 6), "brevity/chars": 5.0, "graded": 0.5}
    # acc is the first term's: the positive brevity term does not make a wrong answer right
    assert wrong.reward == pytest.approx(0.5 / 5) and not wrong.acc


def test_one_failing_term_fails_the_whole_score_with_its_name():
    with Verifier(timeout_s=5.0, reward="tests.reward_plugins:graded + "
                                        "0.1*tests.reward_plugins:misbehaving") as v:
        failed, fine = v.judge(["raise", "x 7"], ["7", "7"])
    assert (failed.reward, failed.acc) == (0.0, False)
    assert "tests.reward_plugins:misbehaving" in failed.error and "ValueError" in failed.error
    assert fine == Score(0.6, True, {"graded": 0.5, "misbehaving": 1.0})


@pytest.mark.parametrize("spec, reason", [
    ("tests.reward_plugins:exact + 0*tests.reward_plugins:graded", "other than 0"),
    ("tests.reward_plugins:exact + nan*tests.reward_plugins:graded", "other than 0"),
    ("tests.reward_plugins:exact + x*tests.reward_plugins:graded", "'x' is not a number"),
    ("tests.reward_plugins:exact + 2*tests.reward_plugins:exact", "appears twice"),
    ("tests.reward_plugins:exact + tests.reward_plugins:two_args", "must take"),
])
def test_a_bad_weighted_sum_is_refused_before_anything_starts(spec, reason):
    with pytest.raises(RewardError) as e:
        Verifier(reward=spec)
    assert reason in str(e.value)


def test_the_builtin_verdict_as_a_term_agrees_with_the_builtin():
    answers = ["12", "0.5", "432", "1000"]
    responses = ["\\boxed{12}", "\\boxed{\\frac{1}{2}}", "\\boxed{433}", "so \\boxed{1,000}"]
    with Verifier(timeout_s=10.0) as builtin, \
            Verifier(timeout_s=10.0, reward="tasks.rewards:boxed_math") as term:
        assert [s.acc for s in builtin.judge(responses, answers)] == [True, True, False, True]
        assert [s.acc for s in term.judge(responses, answers)] == [True, True, False, True]
