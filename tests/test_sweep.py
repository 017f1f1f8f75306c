"""`rlvr sweep`: the product of config values as ordinary runs, resumable, one table at the end.

The pure parts (axes, names) and the resume rules run on stand-in training (as in
tests/test_bench.py); one sweep trains real runs through the launcher. The SLURM sweep is in
tests/test_sweep_slurm.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlvr.bench.common import BenchError
from rlvr.sweep import parse_overrides, plan_runs, slug, split_values, status_text, sweep
from tests.conftest import TINY, run_rlvr


def test_a_comma_outside_brackets_makes_an_axis():
    assert split_values("0,1,2") == ["0", "1", "2"]
    assert split_values("[2,2],[4,4]") == ["[2,2]", "[4,4]"]
    axes, fixed = parse_overrides(["max_staleness=0,2", "ar3po.stage_sizes=[2,2],[4,4]",
                                   "ar3po.reuse_mode=off", "rollout.group_size=[8]"])
    assert axes == {"max_staleness": ["0", "2"], "ar3po.stage_sizes": ["[2,2]", "[4,4]"]}
    assert fixed == ["ar3po.reuse_mode=off", "rollout.group_size=[8]"]
    with pytest.raises(BenchError, match="empty value"):
        parse_overrides(["max_staleness=0,"])


def test_the_runs_are_the_product_of_the_axes_times_the_seeds():
    runs = plan_runs({"max_staleness": ["0", "2"], "ar3po.stage_sizes": ["[2,2]", "[4,4]"]},
                     ["run.steps=5"], seeds=2)
    assert len(runs) == 8 and len({r.name for r in runs}) == 8
    first = runs[0]
    assert first.name == "max_staleness-0_ar3po.stage_sizes-2.2-s0"
    assert first.overrides == ["run.steps=5", "max_staleness=0", "ar3po.stage_sizes=[2,2]",
                               "run.seed=0"]
    assert slug({}) == "base" and plan_runs({}, [], None)[0].overrides == []


def fake_train(calls, fail: set[str] = frozenset()):
    """Stands in for rlvr.launch.train: a finished run of `run.steps` steps whose steps/min and
    accuracy follow max_staleness, so the table can be checked."""
    def train(config, overrides, resume_dir, dry_run):
        opts = dict(o.split("=", 1) for o in overrides)
        run_dir = Path(opts["run.out_dir"]) / opts["run.name"]
        calls.append(run_dir.name)
        if run_dir.name in fail:
            return 1
        s = int(opts.get("max_staleness", 0))
        rows = [{"step": 0, "time_s": 0.0, "eval/avg@8": 0.5}]
        rows += [{"step": k, "time_s": k * 0.5, "perf/step_time": 0.5 / (1 + s),
                  "perf/learner_idle_s": 0.1, "gen/responses_per_step": 100,
                  "gen/responses_per_prompt": 3.0, "stale/mean": s / 2, "stale/max": s,
                  **({"eval/avg@8": 0.6 + s / 100} if k == int(opts["run.steps"]) else {})}
                 for k in range(1, int(opts["run.steps"]) + 1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text("{}")
        return 0
    return train


def test_a_local_sweep_tabulates_each_setting_and_reuses_finished_runs(tmp_path, monkeypatch,
                                                                        capsys):
    calls = []
    monkeypatch.setattr("rlvr.launch.train", fake_train(calls))
    out = tmp_path / "sw"
    args = ["max_staleness=0,2", "run.steps=4", "algorithm=grpo"]
    result = sweep(str(TINY), args, out)
    assert sorted(calls) == ["max_staleness-0", "max_staleness-2"]
    table = (out / "sweep.md").read_text()
    assert "| max_staleness=0 | 4 | 120.0 | 400 | 3.00 | 0.600 |" in table
    assert "| max_staleness=2 | 4 | 360.0 | 400 | 3.00 | 0.620 |" in table
    assert set(result["settings"]) == {"max_staleness=0", "max_staleness=2"}
    assert (out / "compare_steps_per_min.png").exists()
    assert (out / "compare_staleness.png").exists()
    # again: nothing is trained, the table is made from the finished runs
    sweep(str(TINY), args, out)
    assert len(calls) == 2 and "reusing finished run" in capsys.readouterr().out
    # a run cut off before its end is trained again; --status says which are done
    (out / "runs" / "max_staleness-2" / "summary.json").unlink()
    assert "1/2 runs done" in status_text(out)
    sweep(str(TINY), args, out)
    assert calls[2:] == ["max_staleness-2"] and "2/2 runs done" in status_text(out)


def test_a_bad_key_stops_the_sweep_before_any_run(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("rlvr.launch.train", fake_train(calls))
    with pytest.raises(ValueError, match="max_stalenes"):
        sweep(str(TINY), ["max_stalenes=0,2", "run.steps=2"], tmp_path / "sw")
    with pytest.raises(ValueError, match="max_staleness"):
        sweep(str(TINY), ["max_staleness=0,-1", "run.steps=2"], tmp_path / "sw2")
    assert calls == []


def test_another_sweep_in_the_same_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("rlvr.launch.train", fake_train([]))
    sweep(str(TINY), ["max_staleness=0,1", "run.steps=2"], tmp_path / "sw")
    with pytest.raises(BenchError, match="holds another sweep"):
        sweep(str(TINY), ["max_staleness=0,4", "run.steps=2"], tmp_path / "sw")
    with pytest.raises(BenchError, match="holds another sweep"):  # the same settings, longer
        sweep(str(TINY), ["max_staleness=0,1", "run.steps=3"], tmp_path / "sw")


def test_more_settings_extend_a_sweep_and_its_finished_runs_are_reused(tmp_path, monkeypatch,
                                                                       capsys):
    # a tolerance curve measured at K = 0, 4 is extended by K = 2 without training 0 and 4 again
    calls = []
    monkeypatch.setattr("rlvr.launch.train", fake_train(calls))
    sweep(str(TINY), ["max_staleness=0,4", "run.steps=2"], tmp_path / "sw")
    capsys.readouterr()
    result = sweep(str(TINY), ["max_staleness=0,2,4", "run.steps=2"], tmp_path / "sw")
    assert calls == ["max_staleness-0", "max_staleness-4", "max_staleness-2"]
    # the stand-in's runs record no code: reused, and said to be of unknown code
    reused = [line for line in capsys.readouterr().out.splitlines() if "reusing" in line]
    assert len(reused) == 2 and all("(made by code unknown, code now " in r for r in reused)
    assert set(result["settings"]) == {f"max_staleness={k}" for k in (0, 2, 4)}
    # the first command again: its part is reused, and the folder still plans all three
    part = sweep(str(TINY), ["max_staleness=0,4", "run.steps=2"], tmp_path / "sw")
    assert len(calls) == 3 and set(part["settings"]) == {"max_staleness=0", "max_staleness=4"}
    assert len(json.loads((tmp_path / "sw" / "sweep.json").read_text())["runs"]) == 3


@pytest.mark.slow
def test_a_real_local_sweep_trains_each_setting_and_prints_one_table(tmp_path, tiny_model):
    out = tmp_path / "sw"
    args = ["sweep", str(TINY), "max_staleness=0,1", "algorithm=grpo", f"model.path={tiny_model}",
            "run.steps=3", "run.eval_every=3", "task.eval_per_level=8",
            "rollout.prompts_per_step=8", "rollout.prompts_per_work=4", "--out", str(out)]
    done = run_rlvr(*args, timeout_s=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| max_staleness=")]
    assert len(rows) == 2
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == "3" and float(cells[2]) > 0 and float(cells[5]) >= 0  # steps/min, eval
    status = run_rlvr("sweep", "--status", "--out", str(out))
    assert status.returncode == 0 and "2/2 runs done" in status.stdout
    again = run_rlvr(*args, timeout_s=120)
    assert again.returncode == 0 and again.stdout.count("reusing finished run") == 2
    assert re.search(r"\| max_staleness=1 \| 3 \|", again.stdout)
