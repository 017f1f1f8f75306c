"""A generated code task the tiny model can learn: write the linear function two values define.

    python -m tasks.code_task data/code      # writes train.jsonl and eval.jsonl there

Each row asks for a one-line Python function from f(0) and f(1), "f(0)=2 f(1)=5 def f(x):", whose
golden response is "def f(x): return (5-2)*x+2": the slope written as f(1) - f(0), so what the
model must get right is which number goes where, digit for digit (a tiny model does not learn
subtraction in a warm start of minutes). The answer is the hidden tests of tasks/code.py's reward, f at
0, 1, 2, 5, 10 and -3: a wrong slope passes only f(0), a wrong intercept nothing. The level is
the size of the numbers: 1 = slope 1-9 and intercept 0-9, 2 = intercept 10-99, 3 = slope 10-19
and intercept 10-99. Every (slope, intercept) pair is one row; `EVAL_PER_LEVEL` of each level,
picked by a fixed hash, are held out in eval.jsonl. The tiny tokenizer has no newline, hence
one line of code and no fence (tasks/code.py takes a response without a fence as the code).

Train on it with `task.kind=file task.train_path=tasks/data/code/train.jsonl
task.eval_path=tasks/data/code/eval.jsonl task.reward=tasks.code:unit_tests
warm_start.source=task` (configs/tiny-cpu-code.yaml): the warm start then learns the rows'
golden responses from a sloppy teacher, one digit wrong in label_noise of them
(rlvr/warm_start.py). Measured, sync GRPO, lr 2e-4, 20 steps: after 1,200 warm-start steps of
64 rows at lr 3e-3 (loss 0.08) held-out avg@8 0.69 -> 0.815, greedy 1.0 -> 0.979; after 400
(loss 0.17) greedy 0.625 -> 0.042: RL took the undertrained copy apart. The config ships 800
steps at lr 5e-3 (avg@8 0.49, pass@8 0.98, greedy 0.92 at the start: more left to learn, for 2/3
of the cost) and RL at lr 1e-4 (its comment has the measured runs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tasks.arithmetic import stable_hash

TEST_INPUTS = (0, 1, 2, 5, 10, -3)
EVAL_PER_LEVEL = 16
LEVELS = {1: (range(1, 10), range(0, 10)), 2: (range(1, 10), range(10, 100)),
          3: (range(10, 20), range(10, 100))}


def row(slope: int, intercept: int, level: int) -> dict:
    tests = [{"args": [x], "expected": slope * x + intercept} for x in TEST_INPUTS]
    return {"prompt": f"f(0)={intercept} f(1)={slope + intercept} def f(x):",
            "answer": json.dumps({"function": "f", "tests": tests}),
            "solution": f"def f(x): return ({slope + intercept}-{intercept})*x+{intercept}",
            "level": level}


def split() -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): every pair of every level, the held-out ones by hash."""
    train, held_out = [], []
    for level, (slopes, intercepts) in LEVELS.items():
        rows = [row(a, b, level) for a in slopes for b in intercepts]
        rows.sort(key=lambda r: (stable_hash(r["prompt"]), r["prompt"]))
        held_out += rows[:EVAL_PER_LEVEL]
        train += rows[EVAL_PER_LEVEL:]
    return train, held_out


def write(folder: str | Path) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.jsonl", folder / "eval.jsonl"
    for path, rows in zip(paths, split()):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


if __name__ == "__main__":
    for p in write(sys.argv[1] if len(sys.argv) > 1 else "data/code"):
        print(p, sum(1 for _ in p.open()), "rows")
