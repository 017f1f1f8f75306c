"""Injected staleness (`stale_inject`, docs/ALGORITHMS.md 8.2b) in a real run: real learner and
actor processes, ZeroMQ, a gloo weight group and DeepSpeed, started by `rlvr train`."""

from __future__ import annotations

import json

import pytest

from tests.conftest import quick_run_args, read_rows, run_rlvr

pytestmark = pytest.mark.slow

K, STEPS, G = 3, 7, 8  # injected staleness, learner steps, prompts per step


def test_every_trained_token_is_exactly_k_versions_old_once_the_line_is_full(tmp_path,
                                                                            tiny_model):
    run = tmp_path / "inject"
    done = run_rlvr(*quick_run_args(run, tiny_model, "algorithm=grpo", "mode=sync",
                                    f"stale_inject={K}", f"run.steps={STEPS}",
                                    "run.eval_every=100"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_rows(run) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        version = r["step"] - 1  # the learner's version while it trained this row's step
        lag = min(version, K)  # the first K steps train the start's data (the line fills)
        assert r["stale/injected"] == lag
        # every trained token was sampled by the same version, `lag` versions back
        assert r["stale/mean"] == r["stale/max"] == r["stale/oldest_token_max"] == lag
        assert r["groups/trained_first_versions"] == [max(version - K, 0)] * G
        assert r["stale/line_groups"] == K * G  # filled at the first step, then one in one out
    # the decoupled weight saw real staleness: the behaviour log-probs are from older weights
    assert all(r["is/w_mean"] != pytest.approx(1.0, abs=1e-4) for r in rows[K:])
    trained = [g for r in rows for g in r["groups/trained_ids"]]
    # none twice, and the first STEPS x G prompts handed out (the last K steps' wait in the line)
    assert len(trained) == len(set(trained)) == STEPS * G
    assert set(trained) == {f"g{i}" for i in range(STEPS * G)}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stale_inject_untrained_groups"] == K * G  # said, not silently lost
