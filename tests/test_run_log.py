"""RunLog writes one flushed JSON row per step, resumes without gaps, summarises, shows progress.

Run: .venv/bin/pytest tests/test_run_log.py -q
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import time

import numpy as np
import pytest
import torch

from learner.progress import format_progress
from learner.run_log import RunLog, read_metrics


def quiet_log(run_dir, **kwargs) -> RunLog:
    return RunLog(run_dir, {"lr": 1e-3}, wandb_mode="disabled", progress=False, **kwargs)


def test_each_log_call_appends_one_json_row_that_is_on_disk_at_once(tmp_path):
    t0 = time.monotonic()
    run = quiet_log(tmp_path)
    run.log(1, {"reward/acc_mean": 0.5, "stale/hist": [3, 1, 0]})
    time.sleep(0.3)
    run.log(2, {"reward/acc_mean": np.float32(0.75), "grad_norm": torch.tensor(2.0),
                "kl/ref": float("nan"), "policy_version": 1})
    elapsed = time.monotonic() - t0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # before close: flushed
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert list(first)[:3] == ["step", "policy_version", "time_s"]
    assert first["step"] == 1 and first["policy_version"] == 1 and first["stale/hist"] == [3, 1, 0]
    assert second["policy_version"] == 1  # taken from the metrics when given there
    assert second["reward/acc_mean"] == 0.75 and second["grad_norm"] == 2.0
    assert second["kl/ref"] is None  # non-finite -> null, the file stays strict JSON
    # the run's wall time at each row (ms): the sleep between them, both within the test's time
    assert 0.29 <= second["time_s"] - first["time_s"] and second["time_s"] <= elapsed + 0.01
    run.close()
    assert not (tmp_path / "wandb").exists()  # disabled means untouched


def test_steps_must_increase(tmp_path):
    with quiet_log(tmp_path) as run:
        run.log(3, {})
        with pytest.raises(ValueError, match="step 3"):
            run.log(3, {})


def test_read_metrics_tolerates_a_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x"')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert read_metrics(tmp_path / "missing") == []


def test_resume_drops_rows_logged_after_the_checkpoint_and_continues_the_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "policy_version": s, "time_s": 10.0 * s} for s in range(1, 6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "poli')  # crash

    with quiet_log(tmp_path, resume_from_step=3) as run:
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
        run.log(4, {"reward/acc_mean": 0.1})
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [1, 2, 3, 4]
    assert read_metrics(tmp_path)[-1]["time_s"] >= 30.0  # wall time continues, not restarts
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 4


def test_a_folder_with_metrics_is_refused_unless_resuming(tmp_path):
    with quiet_log(tmp_path) as run:
        run.log(1, {})
    with pytest.raises(FileExistsError, match="resume_from_step"):
        quiet_log(tmp_path)


def test_summary_holds_final_metrics_last_eval_and_run_means(tmp_path):
    with quiet_log(tmp_path) as run:
        run.log(1, {"gen/responses_per_prompt": 8.0, "eval/avg@8": 0.2})
        run.log(2, {"gen/responses_per_prompt": 4.0, "kl/ref": math.inf})
        path = run.summary({"note": "done"})
    summary = json.loads(path.read_text())
    assert summary["steps"] == 2 and summary["last_step"] == 2 and summary["note"] == "done"
    assert summary["final"]["gen/responses_per_prompt"] == 4.0
    assert summary["last_eval"] == {"step": 1, "eval/avg@8": 0.2}
    assert summary["means"]["gen/responses_per_prompt"] == 6.0
    assert summary["last10pct_means"]["gen/responses_per_prompt"] == 4.0
    assert summary["code"]["commit"] == subprocess.run(  # the checkout's commit, in full
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_the_summary_names_the_code_the_run_started_with_not_a_later_commit(tmp_path,
                                                                           monkeypatch):
    at_start = {"commit": "a" * 40, "dirty": False}
    monkeypatch.setattr("learner.run_log.code_version", lambda: at_start)
    with quiet_log(tmp_path) as run:
        run.log(1, {"eval/avg@8": 0.2})
        # a commit lands while the run trains (a sweep's next change, a session's edit)
        monkeypatch.setattr("learner.run_log.code_version",
                            lambda: {"commit": "b" * 40, "dirty": True})
        path = run.summary()
    assert json.loads(path.read_text())["code"] == at_start


def test_format_progress_shows_the_headline_numbers():
    line = format_progress(12, 200, {"reward/acc_mean": 0.4125, "gen/responses_per_prompt": 5.31,
                                     "stale/max": 2, "perf/gen_tokens_per_s": 8912.0,
                                     "eval/avg@8": 0.371}, elapsed_s=83, eta_s=1200)
    assert line == ("step 12/200 | acc 0.412 | resp/prompt 5.31 | stale max 2 | avg@8 0.371 | "
                    "8.9k tok/s | 1m23s (eta 20m00s)")
    assert format_progress(1, None, {}, 0.0) == "step 1 | 0m00s"


def test_on_a_pipe_the_progress_line_is_printed_every_n_seconds(tmp_path):
    stream = io.StringIO()
    with RunLog(tmp_path, {}, wandb_mode="disabled", total_steps=3, progress_every_s=3600,
                progress_stream=stream) as run:
        run.log(1, {"reward/acc_mean": 0.5, "eval/avg@8": 0.25})
        run.log(2, {"reward/acc_mean": 0.6})  # within the interval: not printed
        run.log(3, {"reward/acc_mean": 0.7})  # last step: always printed
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("step 1/3 | acc 0.500") and "avg@8 0.250" in lines[0]
    assert lines[1].startswith("step 3/3 | acc 0.700") and "avg@8 0.250" in lines[1]  # last eval kept


def test_on_a_terminal_the_progress_line_is_a_live_rich_line(tmp_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with RunLog(tmp_path, {}, wandb_mode="disabled", total_steps=2, progress_stream=stream) as run:
        run.log(1, {"stale/max": 1})
        run.log(2, {"stale/max": 0})
    assert "step 2/2 | stale max 0" in stream.getvalue()


def test_wandb_offline_writes_its_files_under_the_run_folder_only(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, "unused")  # RunLog sets them; monkeypatch restores them afterwards
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "runs" / "tiny"
    with RunLog(run_dir, {"lr": 1e-3, "model": {"hidden": 32}}, wandb_mode="offline",
                progress=False) as run:
        run.log(1, {"reward/acc_mean": 0.5, "stale/hist": [1, 2]})
        run.log(2, {"reward/acc_mean": float("nan")})
        run.summary({})
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    assert list((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert not home.exists() or not any(home.rglob("*"))  # nothing in $HOME
    assert {p.name for p in tmp_path.iterdir()} <= {"home", "runs"}
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["tiny"]
