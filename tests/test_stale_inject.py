"""Injected staleness (`stale_inject`, docs/ALGORITHMS.md 8.2b) in a real run: real learner and
actor processes, ZeroMQ, a gloo weight group and DeepSpeed, started by `rlvr train`, the learner
SIGKILLed after a checkpoint and resumed."""

from __future__ import annotations

import json
import os
import signal

import pytest

from learner.checkpoint import latest_checkpoint
from tests.conftest import quick_run_args, read_rows, run_rlvr
from tests.test_faults import (FAST_FAULTS, assert_steps_continuous, last_step, processes,
                               start_rlvr, wait_for)

pytestmark = pytest.mark.slow

K, G = 3, 8  # injected staleness, prompts per step


def test_every_trained_token_is_k_versions_old_and_a_resume_loses_nothing_in_the_line(
        tmp_path, tiny_model):
    run_dir, steps, every = tmp_path / "inject", 8, 4
    proc = start_rlvr(*quick_run_args(run_dir, tiny_model, "algorithm=grpo", "mode=sync",
                                      f"stale_inject={K}", f"run.steps={steps}",
                                      f"run.checkpoint_every={every}", "run.eval_every=100",
                                      *FAST_FAULTS))
    checkpoint = run_dir / "checkpoints" / f"step_{every:06d}"
    wait_for("the first checkpoint", lambda: (checkpoint / "COMPLETE").exists(), proc)
    os.kill(processes(run_dir)["learner"]["pid"], signal.SIGKILL)
    proc.communicate(timeout=60)
    # the kill can land while the next checkpoint is written, its step's row already out
    restart = int(latest_checkpoint(run_dir).name.removeprefix("step_"))
    assert restart in (every, 2 * every) and restart <= last_step(run_dir)
    saved = json.loads((checkpoint / "state.json").read_text())
    # the line's K steps of groups were taken but not trained: the checkpoint keeps them
    assert len(saved["coordinator"]["pending"]) >= K * G
    resumed = run_rlvr("train", "--resume", str(run_dir), timeout_s=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = read_rows(run_dir)
    assert_steps_continuous(rows, steps)
    for r in rows[1:]:
        version = r["step"] - 1  # the learner's version while it trained this row's step
        start = 0 if r["step"] <= restart else restart  # the line fills again after a resume
        lag = min(version - start, K)  # the first K steps train the start's data
        assert r["stale/injected"] == lag, r["step"]
        # every trained token was sampled by the same version, `lag` versions back
        assert r["stale/mean"] == r["stale/max"] == r["stale/oldest_token_max"] == lag
        assert r["groups/trained_first_versions"] == [version - lag] * G
        assert r["stale/line_groups"] == K * G  # filled at the first step, then one in one out
        if lag == K:  # the decoupled weight saw it: behaviour log-probs from older weights
            assert r["is/w_mean"] != pytest.approx(1.0, abs=1e-4)
    final = json.loads((run_dir / "checkpoints" / f"step_{steps:06d}" / "state.json").read_text())
    trained = [g for r in rows for g in r.get("groups/trained_ids", [])]
    pending = [p["group_id"] for p in final["coordinator"]["pending"]]
    assert len(trained) == len(set(trained)) == steps * G
    # every prompt handed out is trained once or still pending: the line lost none
    assert sorted(trained + pending) == sorted(f"g{i}" for i in range(final["data_index"]))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stale_inject_untrained_groups"] == K * G  # said, not silently lost
