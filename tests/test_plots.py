"""A run's own plots are drawn from metrics.jsonl alone (comparisons: tests/test_compare.py).

Run: .venv/bin/pytest tests/test_plots.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

from learner.plots import moving_average, plot_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, steps: int, rpp: float, eval_every: int = 5,
              with_train_mean: bool = True, with_eval: bool = True) -> Path:
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            row = {"step": step, "policy_version": step, "time_s": 2.0 * step,
                   "reward/acc_mean": step / steps, "gen/responses_per_prompt": rpp}
            if with_train_mean:
                row["reward/train_mean"] = step / steps / 2
            if with_eval and step % eval_every == 0:
                row["eval/avg@8"] = step / steps / 3
                row["eval/pass@8"] = step / steps / 2
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 9')  # a crash mid-write must not break plotting
    return run_dir


def test_plot_run_writes_the_three_curves_as_png(tmp_path):
    run = write_run(tmp_path / "a", steps=30, rpp=4.0)
    paths = plot_run(run)
    assert [p.name for p in paths] == ["reward.png", "eval.png", "responses_per_prompt.png"]
    for p in paths:
        assert p.parent == run / "plots" and p.read_bytes()[:8] == PNG_MAGIC


def test_plot_run_skips_curves_whose_keys_were_never_logged(tmp_path):
    run = write_run(tmp_path / "a", steps=5, rpp=4.0, with_train_mean=False, with_eval=False)
    assert [p.name for p in plot_run(run)] == ["reward.png", "responses_per_prompt.png"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert plot_run(empty) == []


def test_moving_average_is_a_trailing_mean():
    assert moving_average([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
