"""Loading users' problem files: good rows become Problems, every bad row names file, line, field."""

import itertools
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.datasets import DatasetError, iterate_forever, load_problems, scan_problems
from tasks.arithmetic import Problem


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_jsonl_file_loads_with_numeric_and_string_answers_and_optional_solutions(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm.jsonl",
        [
            {"prompt": "1+1?", "answer": 2},
            {"prompt": "half?", "answer": "\\frac{1}{2}", "solution": "\\boxed{\\frac{1}{2}}"},
            {"prompt": "pi?", "answer": 3.14, "solution": None},
        ],
    )
    assert load_problems(path) == [
        Problem(prompt_id="gsm:1", question="1+1?", answer="2"),
        Problem(prompt_id="gsm:2", question="half?", answer="\\frac{1}{2}", solution="\\boxed{\\frac{1}{2}}"),
        Problem(prompt_id="gsm:3", question="pi?", answer="3.14"),
    ]


def test_field_names_are_configurable_and_may_reach_into_nested_objects(tmp_path):
    path = write_jsonl(
        tmp_path / "math.jsonl", [{"problem": "2*3?", "reward_model": {"ground_truth": "6"}, "sol": "6"}]
    )
    [problem] = load_problems(path, prompt_field="problem", answer_field="reward_model.ground_truth", solution_field="sol")
    assert (problem.question, problem.answer, problem.solution) == ("2*3?", "6", "6")


def test_a_chat_message_prompt_uses_the_last_user_message(tmp_path):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+4?"}]
    path = write_jsonl(tmp_path / "dapo.jsonl", [{"prompt": messages, "answer": "7"}])
    assert load_problems(path)[0].question == "3+4?"


def test_blank_lines_are_skipped_and_ids_follow_physical_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n\n{"prompt": "b", "answer": 2}\n\n')
    assert [p.prompt_id for p in load_problems(path)] == ["d:1", "d:3"]


BAD_ROWS = {
    "not JSON": ("{oops", "not valid JSON"),
    "not an object": ("[1, 2]", "expected a JSON object"),
    "missing prompt": ({"answer": 1}, "missing prompt field 'prompt'"),
    "missing answer": ({"prompt": "q"}, "missing answer field 'answer'"),
    "null answer": ({"prompt": "q", "answer": None}, "missing answer field 'answer'"),
    "empty prompt": ({"prompt": "  ", "answer": 1}, "field 'prompt' (prompt)"),
    "empty answer": ({"prompt": "q", "answer": ""}, "field 'answer' (answer)"),
    "prompt of wrong type": ({"prompt": 5, "answer": 1}, "field 'prompt' (prompt)"),
    "answer of wrong type": ({"prompt": "q", "answer": [1]}, "field 'answer' (answer)"),
    "boolean answer": ({"prompt": "q", "answer": True}, "field 'answer' (answer)"),
    "solution of wrong type": ({"prompt": "q", "answer": 1, "solution": 3}, "field 'solution' (solution)"),
}


@pytest.mark.parametrize("kind", BAD_ROWS)
def test_a_bad_row_raises_an_error_naming_the_file_the_line_and_the_field(tmp_path, kind):
    row, message = BAD_ROWS[kind]
    path = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "ok", "answer": 1}, {"prompt": "ok", "answer": 2}, row])
    with pytest.raises(DatasetError) as error:
        load_problems(path)
    assert f"{path} line 3" in str(error.value)
    assert message in str(error.value)


def test_an_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(DatasetError, match="no problems"):
        load_problems(path)


def test_a_missing_file_or_unknown_suffix_is_an_error_naming_the_path(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_problems(tmp_path / "absent.jsonl")
    (tmp_path / "data.csv").write_text("prompt,answer\n")
    with pytest.raises(DatasetError, match="unsupported file type"):
        load_problems(tmp_path / "data.csv")


def test_a_parquet_file_round_trips_including_nested_dapo_shaped_rows(tmp_path):
    path = tmp_path / "dapo.parquet"
    table = pa.Table.from_pylist(
        [
            {"prompt": [{"role": "user", "content": "1+2?"}], "reward_model": {"ground_truth": "3"}},
            {"prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {"ground_truth": "4"}},
        ]
    )
    pq.write_table(table, path)
    problems = load_problems(path, answer_field="reward_model.ground_truth")
    assert [(p.prompt_id, p.question, p.answer, p.solution) for p in problems] == [
        ("dapo:0", "1+2?", "3", None),
        ("dapo:1", "2+2?", "4", None),
    ]


def test_a_bad_parquet_row_names_the_row_and_field(tmp_path):
    path = tmp_path / "math.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", None]}), path)
    with pytest.raises(DatasetError, match=r"math\.parquet row 1: missing answer field 'answer'"):
        load_problems(path)


def test_an_unreadable_parquet_file_is_a_dataset_error(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="junk.parquet"):
        load_problems(path)


def test_a_datasets_folder_loads_and_its_bad_rows_are_named_by_row(tmp_path):
    import datasets  # a project dependency, never skipped
    rows = [{"question": "1+2?", "meta": {"gold": "3"}, "level": 1},
            {"question": "2+2?", "meta": {"gold": None}, "level": 2},
            {"question": "3+3?", "meta": {"gold": "6"}, "level": 3}]
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                                   "test": datasets.Dataset.from_list(rows[:1])})
    splits.save_to_disk(tmp_path / "math")
    problems, bad = scan_problems(tmp_path / "math" / "train", "question", "meta.gold")
    assert [(p.prompt_id, p.question, p.answer, p.fields["level"]) for p in problems] == [
        ("train:0", "1+2?", "3", 1), ("train:2", "3+3?", "6", 3)]
    assert bad == [f"{tmp_path / 'math' / 'train'} row 1: missing answer field 'meta.gold'"]
    with pytest.raises(DatasetError, match="a DatasetDict; name one split's folder: .*math/test, "
                                           ".*math/train"):
        load_problems(tmp_path / "math", "question", "meta.gold")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DatasetError, match="not one written by datasets' save_to_disk"):
        load_problems(tmp_path / "plain")


PROBLEMS = [Problem(prompt_id=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(7)]


def test_every_epoch_of_the_endless_stream_visits_each_problem_once_in_a_new_order():
    stream = list(itertools.islice(iterate_forever(PROBLEMS, seed=0), 3 * 7))
    epochs = [stream[i : i + 7] for i in range(0, 21, 7)]
    assert all(sorted(e, key=lambda p: p.prompt_id) == PROBLEMS for e in epochs)
    assert len({tuple(p.prompt_id for p in e) for e in epochs}) > 1


def test_the_endless_stream_is_deterministic_and_resumes_at_any_index():
    whole = list(itertools.islice(iterate_forever(PROBLEMS, seed=4), 30))
    assert whole == list(itertools.islice(iterate_forever(PROBLEMS, seed=4), 30))
    for start in (0, 3, 7, 12, 21):
        assert list(itertools.islice(iterate_forever(PROBLEMS, seed=4, start=start), 30 - start)) == whole[start:]


def test_the_endless_stream_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        next(iterate_forever([], seed=0))
