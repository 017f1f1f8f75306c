"""Plots and the comparison table are drawn from metrics.jsonl alone.

Run: .venv/bin/pytest tests/test_plots.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

from learner.plots import compare_runs, moving_average, plot_run

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


def test_compare_runs_overlays_runs_and_tabulates_final_values(tmp_path):
    a = write_run(tmp_path / "grpo", steps=10, rpp=8.0)
    b = write_run(tmp_path / "ar3po", steps=20, rpp=3.5, eval_every=4)
    table, pngs = compare_runs([a, b], tmp_path / "out")
    assert [p.name for p in pngs] == ["compare_reward.png", "compare_eval.png",
                                      "compare_responses_per_prompt.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in pngs)
    lines = table.strip().splitlines()
    assert lines[0] == ("| run | eval/avg@8 | eval/pass@8 | mean gen/responses_per_prompt | steps "
                        "| wall time |")
    assert lines[2] == "| grpo | 0.333 | 0.500 | 8.00 | 10 | 0m20s |"
    assert lines[3] == "| ar3po | 0.333 | 0.500 | 3.50 | 20 | 0m40s |"
    assert (tmp_path / "out" / "compare.md").read_text() == table


def test_compare_runs_marks_missing_values_and_disambiguates_equal_names(tmp_path):
    a = write_run(tmp_path / "x" / "run", steps=3, rpp=2.0, with_eval=False)
    b = write_run(tmp_path / "y" / "run", steps=3, rpp=2.0, with_eval=False)
    table, pngs = compare_runs([a, b], tmp_path / "out")
    assert "| x/run | - | - | 2.00 | 3 | 0m06s |" in table and "| y/run |" in table
    assert "compare_eval.png" not in [p.name for p in pngs]


def test_moving_average_is_a_trailing_mean():
    assert moving_average([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
