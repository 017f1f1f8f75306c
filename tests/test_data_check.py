"""`rlvr data check` and `rlvr train`'s check before any process starts: a bad row or model
folder is named (key, file, line) in one line, and no process is started for it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from protocol.config import load_config
from rlvr import data_check
from rlvr.data_check import check_model
from tests.conftest import TINY, run_rlvr

ROWS = [
    {"prompt": "1+1=", "answer": "2"},
    {"prompt": [{"role": "user", "content": "2+2="}], "answer": 4},
    "not json",
    {"prompt": "3+3=", "answer": True},
    {"prompt": "4+4=", "answer": "\\"},  # math-verify reads nothing in it
    {"question": "5+5=", "answer": "10"},
]


def problems_file(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def file_task(path: Path, *more: str) -> list[str]:
    return [str(TINY), "task.kind=file", f"task.train_path={path}", *more]


def test_data_check_lists_every_bad_row_with_its_file_and_line(tmp_path, tiny_model):
    path = problems_file(tmp_path / "mixed.jsonl", ROWS)
    out = run_rlvr("data", "check", *file_task(path, f"model.path={tiny_model}"))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"model.path {tiny_model}: ok" in lines
    assert f"task.train_path {path}: 2 good rows, 4 bad" in lines
    assert f"  {path} line 3: not valid JSON (Expecting value)" in lines
    assert any(f"{path} line 4: field 'answer'" in x and "got bool True" in x for x in lines)
    assert any("(mixed:5): answer '\\\\' is not parseable by math-verify" in x for x in lines)
    assert f"  {path} line 6: missing prompt field 'prompt'" in lines


def test_data_check_passes_a_good_file_and_the_built_in_task(tmp_path, tiny_model):
    path = problems_file(tmp_path / "good.jsonl", ROWS[:2])
    out = run_rlvr("data", "check", *file_task(path, f"model.path={tiny_model}"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"task.train_path {path}: 2 good rows, 0 bad" in out.stdout
    built_in = run_rlvr("data", "check", str(TINY))
    assert built_in.returncode == 0 and "no files to check" in built_in.stdout


def test_data_check_reads_a_datasets_folder_and_names_its_bad_rows_and_answers(tmp_path):
    import datasets  # a project dependency, never skipped

    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": None},
            {"prompt": "4+4=", "answer": "\\"}]
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "ds")
    out = run_rlvr("data", "check", *file_task(tmp_path / "ds"))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"task.train_path {tmp_path / 'ds'}: 1 good rows, 2 bad" in lines
    assert f"  {tmp_path / 'ds'} row 1: missing answer field 'answer'" in lines
    assert any("(ds:2): answer '\\\\' is not parseable by math-verify" in x for x in lines)


def test_data_check_asks_a_reward_function_of_the_users_about_each_answer(tmp_path):
    good = json.dumps({"function": "add", "tests": [{"args": [1, 2], "expected": 3}]})
    path = problems_file(tmp_path / "code.jsonl", [
        {"prompt": "Write add(a, b).", "answer": good},
        {"prompt": "Write sub(a, b).", "answer": "{\"function\": \"sub\", \"tests\": []}"},
        {"prompt": "Write mul(a, b).", "answer": "mul"}])
    out = run_rlvr("data", "check", *file_task(path, "task.reward=tasks.code:unit_tests"))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "task.reward tasks.code:unit_tests: ok" in lines
    assert f"task.train_path {path}: 1 good rows, 2 bad" in lines
    assert any("(code:2): answer" in x and "check_answer: ValueError: each test must be" in x
               for x in lines)
    assert any("(code:3): answer 'mul' is refused by tasks.code:unit_tests's check_answer: "
               "JSONDecodeError" in x for x in lines)


def test_data_check_asks_every_term_of_a_weighted_sum_that_can_check(tmp_path):
    path = problems_file(tmp_path / "sum.jsonl", [{"prompt": "1+1=", "answer": "2"},
                                                   {"prompt": "4+4=", "answer": "\\"}])
    spec = "tests.reward_plugins:graded + 0.5*tasks.rewards:boxed_math"
    out = run_rlvr("data", "check", *file_task(path, f"task.reward={spec}"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"task.train_path {path}: 1 good rows, 1 bad" in out.stdout
    assert "(sum:2): answer '\\\\' is refused by tasks.rewards:boxed_math's check_answer: " \
        "ValueError: math-verify cannot parse it" in out.stdout


def test_train_refuses_a_bad_row_in_one_line_before_any_process_starts(tmp_path, tiny_model):
    path = problems_file(tmp_path / "mixed.jsonl", [ROWS[0], ROWS[3], ROWS[5]])
    out = run_rlvr("train", *file_task(path, f"model.path={tiny_model}",
                                       f"run.out_dir={tmp_path}", "run.name=refused"))
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line == (f"rlvr: config error: task.train_path: {path} line 2: field 'answer' "
                    "(answer) must be a non-empty string or a number, got bool True "
                    "(and 1 more: rlvr data check lists them)")
    assert not (tmp_path / "refused" / "logs").exists()  # no learner, no actor was started


@pytest.mark.parametrize("broken", ["missing", "empty", "architecture", "tokenizer"])
def test_a_model_path_that_is_no_loadable_model_is_named_in_one_line(broken, tmp_path,
                                                                      tiny_model):
    model = tmp_path / "model"
    match broken:
        case "empty":
            model.mkdir()
        case "architecture":
            model.mkdir()
            (model / "config.json").write_text(json.dumps({"model_type": "vit"}))  # images
        case "tokenizer":  # a whole model, its tokenizer files gone
            model.mkdir()
            for f in tiny_model.iterdir():
                if "token" not in f.name and f.is_file():
                    (model / f.name).write_bytes(f.read_bytes())
    problem = check_model(load_config(TINY, [f"model.path={model}"]))
    expected = {"missing": "no such folder", "empty": "no config.json",
                "architecture": "model_type 'vit' is not an architecture",
                "tokenizer": "no loadable tokenizer"}[broken]
    assert problem.startswith(f"model.path {model}: ") and expected in problem
    assert "\n" not in problem
    assert check_model(load_config(TINY, [f"model.path={tiny_model}"])) is None


def test_a_model_folder_that_passed_is_checked_again_only_when_a_file_the_check_reads_changes(
        tmp_path, tiny_model, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    cfg = load_config(TINY, [f"model.path={model}", f"warm_start.cache_dir={tmp_path / 'cache'}"])
    assert check_model(cfg) is None
    real_check = data_check._check_model_folder
    monkeypatch.setattr(data_check, "_check_model_folder", lambda path: "checked again")
    assert check_model(cfg) is None  # remembered: transformers is not imported for it
    (model / "model.safetensors").write_bytes(b"other weights")  # the check reads no weights
    assert check_model(cfg) is None
    monkeypatch.setattr(data_check, "_check_model_folder", real_check)
    config = (model / "config.json").read_text()
    assert '"vocab_size": 101' in config  # an edit of the same size, so only the bytes differ
    (model / "config.json").write_text(config.replace('"vocab_size": 101', '"vocab_size":  99'))
    assert check_model(cfg) == (f"model.path {model}: the tokenizer has 101 tokens, the model "
                                "embeds 99")


def test_train_refuses_a_model_path_before_any_process_starts(tmp_path):
    (tmp_path / "model").mkdir()
    out = run_rlvr("train", str(TINY), f"model.path={tmp_path / 'model'}",
                   f"run.out_dir={tmp_path}", "run.name=refused")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line == (f"rlvr: config error: model.path {tmp_path / 'model'}: no config.json (not "
                    "a Hugging Face model folder)")
    assert not (tmp_path / "refused" / "logs").exists()
