"""`rlvr bench` end to end at a tiny size: real training runs through the launcher, real weight
broadcasts between processes, real ZeroMQ sockets; each results.json holds the documented keys
with finite, plausible numbers. (The arithmetic itself is in tests/test_bench_math.py.)"""

import json
import math
from pathlib import Path

import pytest

from rlvr.bench.common import BenchError, train_run
from tests.conftest import TINY, run_rlvr

PROMPTS, GROUP = 8, 8
SMALL = ["task.eval_per_level=8", f"rollout.prompts_per_step={PROMPTS}",
         "rollout.prompts_per_work=4", f"rollout.group_size={GROUP}"]


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def bench(kind: str, out, *args: str, timeout_s: float = 240) -> dict:
    result = run_rlvr("bench", kind, *args, "--out", str(out), timeout_s=timeout_s)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| target | met |" in result.stdout  # the printed table with the targets
    return json.loads((out / "results.json").read_text())


def assert_targets_block(results: dict) -> None:
    assert results["targets"]
    for t in results["targets"].values():
        assert t["met"] in (True, False) and finite(t["value"]) and finite(t["threshold"])


@pytest.mark.slow
def test_efficiency_counts_every_generated_response_for_each_algorithm(tiny_model, tmp_path):
    # the three its reductions are about; aero and hora train end to end in test_algorithms_e2e
    out = tmp_path / "efficiency"
    r = bench("efficiency", out, str(TINY), "--steps", "2", "--algorithms", "grpo,dapo,ar3po",
              f"model.path={tiny_model}", *SMALL)
    algos = r["algorithms"]
    assert set(algos) == {"grpo", "dapo", "ar3po"}
    assert algos["grpo"]["responses_per_step"]["mean"] == PROMPTS * GROUP  # exactly N per prompt
    assert algos["dapo"]["responses_per_step"]["mean"] >= PROMPTS * GROUP  # over-sampling counts
    assert 1 <= algos["ar3po"]["responses_per_prompt"]["mean"] <= GROUP
    for name, a in algos.items():
        for key in ("responses_per_step", "responses_per_prompt", "wall_s", "total_gen_tokens"):
            assert finite(a[key]["mean"]) and a[key]["mean"] > 0, (name, key)
        assert 0 <= a["eval_avg@8"]["mean"] <= 1 and a["eval_avg@8"]["std"] == 0.0
        assert 0 <= a["eval_pass@8"]["mean"] <= 1
    assert r["ar3po_reduction_vs_grpo"] == pytest.approx(
        PROMPTS * GROUP / algos["ar3po"]["responses_per_step"]["mean"])
    assert finite(r["ar3po_reduction_vs_dapo"]) and r["ar3po_reduction_vs_dapo"] > 0
    assert_targets_block(r)
    assert all((out / p).exists() for p in ("efficiency_responses.png",
                                            "efficiency_accuracy_vs_responses.png"))


@pytest.mark.slow
def test_throughput_reports_each_schedule_and_plan_predicts_them_from_the_same_runs(tiny_model,
                                                                                tmp_path):
    # one --out for both benches: plan's sync and async_s2 runs have throughput's arguments, so
    # it reuses them (as a user saves a second set of runs) and adds only its own measurements
    out = tmp_path / "bench"
    common = ["--steps", "8", f"model.path={tiny_model}", *SMALL]
    r = bench("throughput", out, str(TINY), "--modes", "sync,async_s2,staged", *common)
    assert set(r["modes"]) == {"sync", "async_s2", "staged"}
    for mode, m in r["modes"].items():
        assert finite(m["steps_per_min"]) and m["steps_per_min"] > 0, mode
        assert 0 <= m["learner_busy_frac"] <= 1, mode
        assert finite(m["actor_busy_frac"]) and m["actor_busy_frac"] > 0, mode
        assert finite(m["gen_tokens_per_s"]) and finite(m["train_tokens_per_s"]), mode
        assert 0 <= m["eval_avg@8"] <= 1, mode
    assert r["modes"]["sync"]["stale_max"] == 0
    assert finite(r["speedup_async_vs_sync"])
    assert 1 <= r["overlap_bound"] <= 2
    assert_targets_block(r)
    assert (out / "throughput.png").exists()

    result = run_rlvr("bench", "plan", str(TINY), "--staleness", "2", *common, "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("bench: reusing finished run") == 2
    assert "bench: training" not in result.stdout
    p = json.loads((out / "results.json").read_text())
    assert set(p["modes"]) == {"sync", "async_s2"}
    for mode, m in p["modes"].items():
        for pred in (m["predicted"], m["predicted_cluster"]):
            assert finite(pred["steps_per_min"]) and pred["steps_per_min"] > 0, mode
        assert m["measured"]["steps_per_min"] == pytest.approx(r["modes"][mode]["steps_per_min"])
        assert finite(m["error"]), mode
    assert p["modes"]["sync"]["predicted"]["stale_max"] == 0
    assert p["contention"]["actor_slowdown"] > 0 and p["contention"]["learner_slowdown"] > 0
    assert p["costs"]["items"] >= 5 and p["costs"]["G_s"] > 0
    probe = p["costs"]["decode_probe"]  # measured on the sync run's engine, kept in the run
    # batching is real on the engine the bench measured: its widest decode step costs far
    # less than that many steps of one row (the planner's line rests on it)
    one = sum(t for n, _, t in probe["decode_points"] if n == 1) / sum(
        1 for n, _, _ in probe["decode_points"] if n == 1)
    top = max(n for n, _, _ in probe["decode_points"])
    full = [t for n, _, t in probe["decode_points"] if n == top]
    assert top >= 16 and sum(full) / len(full) < top * one / 4
    assert (Path(p["measurement_run"]) / "plan" / "decode_cost.json").exists()
    assert_targets_block(p)
    # the planner's own command on the measurement run: a table and a recommendation
    done = run_rlvr("plan", p["measurement_run"], "--actors", "1,2", "--learner-ranks", "1",
                    "--max-staleness", "0,2", "--steps", "40", "--seeds", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recommended split per GPU budget" in done.stdout


@pytest.mark.slow
def test_weights_broadcast_and_memory_copy_bandwidths(tmp_path):
    r = bench("weights", tmp_path / "weights", str(TINY), "--big-mb", "8", "--rounds", "3")
    for name in ("model", "flat_8mb"):
        case = r["cases"][name]
        assert finite(case["broadcast_gb_per_s"]) and finite(case["copy_gb_per_s"])
    assert r["cases"]["flat_8mb"]["bytes"] == 8 << 20
    assert_targets_block(r)


@pytest.mark.slow
def test_transport_messages_per_second_and_share_of_a_learner_step(tiny_model, tmp_path):
    r = bench("transport", tmp_path / "transport", str(TINY), "--messages", "200",
              f"model.path={tiny_model}", *SMALL)
    assert r["zeromq"]["rejected"] == 0 and r["zeromq"]["messages"] == 200
    assert finite(r["zeromq"]["messages_per_s"]) and r["zeromq"]["messages_per_s"] > 0
    assert finite(r["codec"]["decode_per_s"]) and r["codec"]["bytes_per_message"] > 0
    assert finite(r["learner_step_s"]) and r["learner_step_s"] > 0
    assert 0 < r["share_of_learner_step"] < 1
    assert_targets_block(r)


@pytest.mark.slow
def test_memory_the_full_logits_grow_with_tokens_and_the_chunked_head_does_not(tmp_path):
    # a 32k vocabulary and 128-token rows: 256 MB of float32 logits at 2048 tokens, in seconds;
    # 8 MB chunks (64 tokens), so both sizes take several
    r = bench("memory", tmp_path / "memory", "--tokens", "512,2048", "--seq-len", "128",
              "--vocab", "32768", "--hidden", "32", "--layers", "1", "--chunk-mb", "8")
    small, big = r["cases"]["512"], r["cases"]["2048"]
    assert big["logits_mb"] == pytest.approx(4 * small["logits_mb"])
    assert big["head_full_mb"] > 3 * small["head_full_mb"]  # grows with T x V
    assert big["head_chunked_mb"] < 1.5 * small["head_chunked_mb"]  # one chunk at a time
    assert big["full"] > 2 * big["chunked"]
    assert_targets_block(r)


# -- run folders: an interrupted bench continues, nobody else's run is touched ------------------

def fake_train(calls):
    """Stands in for rlvr.launch.train: writes a finished run of `run.steps` steps."""
    def train(config, overrides, resume_dir, dry_run):
        opts = dict(o.split("=", 1) for o in overrides)
        run_dir = Path(opts["run.out_dir"]) / opts["run.name"]
        rows = [{"step": s, "time_s": float(s)} for s in range(int(opts["run.steps"]) + 1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text("{}")
        calls.append(run_dir.name)
        return 0
    return train


def test_a_finished_run_with_the_same_arguments_is_reused_and_an_interrupted_one_redone(
        tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("rlvr.launch.train", fake_train(calls))
    overrides = ["run.steps=3", "algorithm=grpo"]
    run_dir, launch = train_run(str(TINY), tmp_path, "grpo-s0", overrides)
    assert calls == ["grpo-s0"] and "seconds" in launch
    assert train_run(str(TINY), tmp_path, "grpo-s0", overrides) == (run_dir,
                                                                     {"reused": True, **launch})
    assert calls == ["grpo-s0"]
    (run_dir / "summary.json").unlink()  # cut off before the end: trained again
    train_run(str(TINY), tmp_path, "grpo-s0", overrides)
    assert calls == ["grpo-s0", "grpo-s0"]


def test_a_run_folder_with_other_arguments_stops_the_bench_untouched(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("rlvr.launch.train", fake_train(calls))
    run_dir, _ = train_run(str(TINY), tmp_path, "grpo-s0", ["run.steps=3"])
    with pytest.raises(BenchError, match="other arguments"):
        train_run(str(TINY), tmp_path, "grpo-s0", ["run.steps=4"])
    assert (run_dir / "metrics.jsonl").exists() and calls == ["grpo-s0"]
