"""The generated code task (tasks/code_task.py): the shipped rows are the
generator's, the held-out split is apart, every row passes data check (a golden solution
passing its tests in the sandbox is in tests/test_sandbox.py, with every test that runs one)."""

from __future__ import annotations

import json

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
