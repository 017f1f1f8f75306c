"""The built-in arithmetic task: correct answers, digit levels, disjoint fixed splits, O(1) resume."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.arithmetic import Arithmetic, Problem, level_size, worked_response
from tasks.math_answer import extract_boxed


def first(n, stream):
    return list(itertools.islice(stream, n))


def operands(question):
    body = question.removesuffix("=")
    for op in "+-*":
        if op in body:
            a, b = body.split(op)
            return int(a), op, int(b)
    raise AssertionError(question)


def test_a_problem_is_a_frozen_record_with_optional_level_and_solution():
    problem = Problem(prompt_id="p", question="1+1=", answer="2")
    assert problem.level == 0 and problem.solution is None
    with pytest.raises(AttributeError):
        problem.answer = "3"


@given(seed=st.integers(0, 10**6), index=st.integers(0, 10**9))
@settings(max_examples=100, deadline=None)
def test_every_training_problem_has_the_right_answer_digits_and_golden_solution(seed, index):
    task = Arithmetic(ops=("+", "-", "*"))
    problem = task.train_problem(seed, index)
    a, op, b = operands(problem.question)
    assert problem.answer == str({"+": a + b, "-": a - b, "*": a * b}[op])
    assert max(len(str(a)), len(str(b))) == problem.level
    assert problem.level in task.levels
    assert problem.solution == "\\boxed{" + problem.answer + "}"
    assert problem.prompt_id == "arith:" + problem.question


def test_subtraction_puts_the_larger_operand_first_so_answers_are_non_negative():
    problems = first(500, Arithmetic(ops=("-",)).train_stream(seed=3))
    assert all(int(p.answer) >= 0 for p in problems)


def test_the_smaller_operand_takes_every_digit_count_up_to_the_level():
    problems = [p for p in first(2000, Arithmetic(levels=(3,)).train_stream(seed=1))]
    smaller_digits = {min(len(str(a)), len(str(b))) for a, _, b in map(operands, (p.question for p in problems))}
    assert smaller_digits == {1, 2, 3}


def test_the_eval_set_has_eval_per_level_problems_of_each_level_and_is_the_same_every_call():
    task = Arithmetic(levels=(1, 2, 3), eval_per_level=64)
    evals = task.eval_set()
    assert [sum(p.level == d for p in evals) for d in (1, 2, 3)] == [64, 64, 64]
    assert len({p.question for p in evals}) == len(evals)
    assert Arithmetic(levels=(1, 2, 3), eval_per_level=64).eval_set() == evals


def test_eval_problems_are_held_out_and_training_never_yields_a_held_out_question():
    task = Arithmetic()
    evals = {p.question for p in task.eval_set()}
    assert all(task.is_held_out(q) for q in evals)
    train = first(5000, task.train_stream(seed=0))
    assert not any(task.is_held_out(p.question) for p in train)
    assert not evals & {p.question for p in train}


def test_the_split_does_not_depend_on_the_seed_so_no_seed_trains_on_another_seeds_eval():
    evals_seed_1 = {p.question for p in Arithmetic(seed=1).eval_set()}
    train_seed_0 = {p.question for p in first(5000, Arithmetic(seed=0).train_stream(seed=7))}
    assert not evals_seed_1 & train_seed_0
    assert evals_seed_1 != {p.question for p in Arithmetic(seed=0).eval_set()}


def test_a_small_level_holds_out_at_most_half_its_questions_and_still_trains_on_the_rest():
    assert level_size(1, ("+", "-")) == 155  # 100 ordered sums, 55 non-negative differences
    task = Arithmetic(levels=(1,), eval_per_level=500)
    evals = task.eval_set()
    assert len(evals) == 155 // 2
    train = {p.question for p in first(3000, task.train_stream(seed=0))}
    assert len(train) == 155 - len(evals)  # every other level-1 question shows up in training


def test_level_one_with_default_settings_has_64_eval_and_91_train_questions():
    task = Arithmetic(levels=(1,))
    assert len(task.eval_set()) == 64
    assert len({p.question for p in first(3000, task.train_stream(seed=0))}) == 91


def test_the_same_seed_gives_the_same_stream_and_another_seed_a_different_one():
    task = Arithmetic()
    assert first(50, task.train_stream(seed=5)) == first(50, task.train_stream(seed=5))
    assert first(50, task.train_stream(seed=5)) != first(50, task.train_stream(seed=6))


def test_resuming_at_an_index_continues_the_stream_exactly():
    task = Arithmetic()
    whole = first(40, task.train_stream(seed=2))
    assert first(15, task.train_stream(seed=2, start=25)) == whole[25:]


def test_a_repeated_question_keeps_its_prompt_id():
    problems = first(3000, Arithmetic(levels=(1,)).train_stream(seed=0))
    ids = {}
    for p in problems:
        assert ids.setdefault(p.question, p.prompt_id) == p.prompt_id
    assert len(ids) < len(problems)  # level 1 repeats, so the check above was exercised


def test_level_weights_set_the_mix_of_levels():
    task = Arithmetic(levels=(1, 2, 3))
    levels = [p.level for p in first(600, task.train_stream(seed=0, level_weights=(0.0, 1.0, 3.0)))]
    assert 1 not in levels
    assert levels.count(3) > 2 * levels.count(2)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(levels=()),
        dict(levels=(0,)),
        dict(levels=(1, 1)),
        dict(ops=("/",)),
        dict(eval_per_level=-1),
        dict(levels=(3,), eval_per_level=100_000),  # more than a tenth of level 3 can hold out
        dict(response_format="steps"),
        dict(ops=("+", "*"), response_format="worked"),  # no working written for products
    ],
)
def test_bad_task_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        Arithmetic(**kwargs)


def test_bad_level_weights_are_rejected_before_the_first_problem():
    task = Arithmetic(levels=(1, 2))
    for weights in [(1.0,), (1.0, -1.0), (0.0, 0.0)]:
        with pytest.raises(ValueError, match="level_weights"):
            task.train_stream(seed=0, level_weights=weights)


@given(st.integers(0, 9999), st.integers(0, 9999), st.sampled_from("+-"))
def test_a_worked_response_does_each_column_right_and_boxes_the_answer(a, b, op):
    if op == "-":
        a, b = max(a, b), min(a, b)
    text = worked_response(a, op, b)
    *steps, boxed = text.split(" ")
    assert boxed == "\\boxed{" + str(a + b if op == "+" else a - b) + "}"
    assert len(steps) == max(len(str(a)), len(str(b)))
    for step in steps:  # every column's arithmetic holds: "4+8+1=13", "12-7=5", "5-1-1=3"
        lhs, rhs = step.split("=")
        assert eval(lhs) == int(rhs)  # noqa: S307 - digits and +/- of our own making
    assert extract_boxed(text) == str(a + b if op == "+" else a - b)


def test_the_worked_format_gives_longer_golden_responses_with_the_same_answers():
    boxed, worked = Arithmetic(), Arithmetic(response_format="worked")
    for p, q in zip(boxed.eval_set(), worked.eval_set()):
        assert (p.question, p.answer) == (q.question, q.answer)
        assert p.solution == "\\boxed{" + p.answer + "}"
        assert q.solution.endswith(p.solution) and len(q.solution) > len(p.solution) + 4
