"""The generated code task (tasks/code_task.py): the shipped rows are the
generator's, the held-out split is apart, a golden solution passes every hidden test in the
sandbox and the sloppy teacher's one wrong digit fails some."""

from __future__ import annotations

import json
import random

from rlvr.warm_start import corrupt_answer
from tasks.code import unit_tests
from tasks.code_task import EVAL_PER_LEVEL, LEVELS, split
from tasks.tiny_model import load_tokenizer
from tests.conftest import ROOT, run_rlvr

DATA = ROOT / "tasks" / "data" / "code"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_the_shipped_rows_are_the_generators_and_the_split_keeps_them_apart():
    train, held_out = split()
    assert rows("train.jsonl") == train and rows("eval.jsonl") == held_out
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert [sum(r["level"] == level for r in held_out) for level in LEVELS] == \
        [EVAL_PER_LEVEL] * len(LEVELS)


def test_a_golden_solution_passes_every_test_and_one_wrong_digit_fails_some():
    rng = random.Random(0)
    for row in rng.sample(rows("eval.jsonl") + rows("train.jsonl"), 6):
        golden = unit_tests(row["solution"], row["answer"], {})
        assert golden["acc"] and golden["reward"] == 1.0, row
        sloppy = corrupt_answer(row["solution"], 1.0, rng)
        assert sloppy != row["solution"]
        assert unit_tests(sloppy, row["answer"], {})["reward"] < 1.0, (sloppy, row)


def test_data_check_accepts_every_row_of_the_code_task():
    out = run_rlvr("data", "check", str(ROOT / "configs" / "tiny-cpu.yaml"), "task.kind=file",
                   f"task.train_path={DATA / 'train.jsonl'}", f"task.eval_path={DATA / 'eval.jsonl'}",
                   "task.reward=tasks.code:unit_tests")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1752 good rows, 0 bad" in out.stdout and "48 good rows, 0 bad" in out.stdout


def test_the_tiny_models_tokenizer_keeps_the_spaces_of_code(tiny_model):
    # AutoTokenizer loads it as Qwen2Tokenizer, which encoded "deff(x):return3*x+8"
    tok = load_tokenizer(tiny_model)
    for text in ("def f(x): return 3*x+8", "f(0)=8 f(1)=11 def f(x):", "7+5=12 4+8+1=13"):
        assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
