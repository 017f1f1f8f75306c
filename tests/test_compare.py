"""`rlvr compare` (rlvr/compare.py): one table and overlaid curves from run folders' metrics.jsonl.

Run: .venv/bin/pytest tests/test_compare.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.compare import compare_runs, run_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, steps: int, rpp: float, step_s: float = 0.5, eval_every: int = 5,
              with_eval: bool = True, stale_max: int = 1) -> Path:
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "time_s": 0.0, "eval/avg@8": 0.1, "eval/pass@8": 0.2})
                + "\n")
        for step in range(1, steps + 1):
            row = {"step": step, "policy_version": step, "time_s": step_s * step,
                   "perf/step_time": step_s, "perf/learner_idle_s": step_s / 2,
                   "reward/acc_mean": step / steps, "gen/responses_per_prompt": rpp,
                   "gen/responses_per_step": 4 * rpp, "stale/mean": stale_max / 2,
                   "stale/max": stale_max if step > 1 else 0}
            if with_eval and step % eval_every == 0:
                row["eval/avg@8"] = step / steps / 3
                row["eval/pass@8"] = step / steps / 2
                row["timing/eval"] = 1.0
                row["perf/step_time"] = step_s + 1.0  # evaluation is left out of steps/min
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 9')  # a crash mid-write must not break the comparison
    return run_dir


def test_compare_runs_tabulates_speed_cost_accuracy_and_staleness(tmp_path):
    a = write_run(tmp_path / "sync", steps=10, rpp=8.0, step_s=0.5, stale_max=0)
    b = write_run(tmp_path / "async", steps=20, rpp=3.5, step_s=0.25, eval_every=4, stale_max=2)
    text, pngs = compare_runs([a, b], tmp_path / "out")
    assert [p.name for p in pngs] == [
        "compare_steps_per_min.png", "compare_responses_generated.png", "compare_eval.png",
        "compare_staleness.png", "compare_reward.png", "compare_responses_per_prompt.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in pngs)
    lines = text.strip().splitlines()
    assert lines[0] == ("| run | steps | steps/min | responses | responses/prompt | eval/avg@8 | "
                        "eval/pass@8 | stale mean | stale max | wall time |")
    # 60 / 0.5 s = 120 steps/min; 10 steps x 32 responses; the last evaluation (step 10)
    assert lines[2] == "| sync | 10 | 120.0 | 320 | 8.00 | 0.333 | 0.500 | 0.00 | 0 | 0m05s |"
    assert lines[3] == "| async | 20 | 240.0 | 280 | 3.50 | 0.333 | 0.500 | 1.00 | 2 | 0m05s |"
    assert (tmp_path / "out" / "compare.md").read_text() == text


def test_compare_runs_marks_missing_values_and_disambiguates_equal_names(tmp_path):
    a = write_run(tmp_path / "x" / "run", steps=3, rpp=2.0, with_eval=False)
    b = write_run(tmp_path / "y" / "run", steps=3, rpp=2.0, with_eval=False)
    (tmp_path / "x" / "run" / "metrics.jsonl").write_text('{"step": 1, "time_s": 1.0}\n')
    text, pngs = compare_runs([a, b], tmp_path / "out")
    assert "| x/run | 1 | - | - | - | - | - | - | - | 0m01s |" in text and "| y/run |" in text


def test_labels_can_name_the_settings_of_a_sweep(tmp_path):
    a = write_run(tmp_path / "r0", steps=4, rpp=2.0)
    text, _ = compare_runs([a], tmp_path / "out", labels=["max_staleness=2"])
    assert "| max_staleness=2 | 4 |" in text


def test_run_summary_reads_the_eval_k_the_run_logged(tmp_path):
    rows = [{"step": 0, "eval/avg@4": 0.5, "eval/pass@4": 0.75},
            {"step": 1, "perf/step_time": 1.0, "perf/learner_idle_s": 0.5, "eval/avg@4": 0.6}]
    s = run_summary(rows)
    assert (s["k"], s["eval/avg@4"], s["eval/pass@4"]) == (4, 0.6, 0.75)
