"""The learner's update in a real run (real actor and learner processes, `rlvr train`): at a
sampling temperature other than 1 sync mode stays exactly on-policy, and the KL term measures
the distance to the initial model, also after a resume."""

from __future__ import annotations

import pytest

from tests.conftest import assert_on_policy, quick_run_args, read_rows, run_rlvr

pytestmark = pytest.mark.slow


def test_a_sync_run_at_temperature_0_7_is_on_policy_and_its_kl_starts_at_zero_and_survives_resume(
        tmp_path, tiny_model):
    run = tmp_path / "hot"
    first = run_rlvr(*quick_run_args(run, tiny_model, "algorithm=grpo", "mode=sync",
                                     "rollout.temperature=0.7", "loss.kl_beta=0.05",
                                     "optim.lr=2e-3", "run.steps=3", "run.eval_every=100"))
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_rlvr("train", "--resume", str(run), "run.steps=4")
    assert again.returncode == 0, again.stderr[-3000:]
    rows = [r for r in read_rows(run) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the learner's log-probs at T = 0.7 are the actor's: the decoupled weight is 1
    assert_on_policy(rows)
    assert all(r["stale/max"] == 0 for r in rows)
    kl = [r["kl/mean"] for r in rows]
    assert kl[0] == pytest.approx(0.0, abs=1e-7)  # step 1 trains the reference's own weights
    assert kl[2] > 1e-4
    # after the resume the reference is still the initial model (model.path), not the
    # checkpoint the policy resumed from: step 4 measures three steps of distance, not zero
    assert kl[3] > 1e-4
