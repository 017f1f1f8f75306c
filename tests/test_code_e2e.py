"""The code task trains on the sandbox's verdicts: `rlvr train configs/tiny-cpu-code.yaml`
runs every sampled function against its row's hidden tests in the sandbox (tasks/sandbox.py), and
the training rows carry what the tests said: tests passed and failed, not a crash on every row.
How much RL on those verdicts raises the held-out pass rate from the config's own warm start is
in BENCHMARKS.md ("Learning from the full warm starts"); the policy gradient's learning is
checked in CI by tests/test_reward_e2e.py and tests/test_vllm_e2e.py.

In this file's lane with tests/test_sandbox.py (tests/lanes.py): those check machine-wide that
no sandbox process is left, and this run starts hundreds.
"""

from __future__ import annotations

import pytest

from tests.conftest import CODE, ROOT, read_rows, run_rlvr

pytestmark = pytest.mark.slow

STEPS, ROWS = 5, 4


def test_the_code_config_trains_on_the_tests_each_sampled_function_passes(tmp_path, code_model):
    # tests/conftest.py's code_model: its functions pass some of a row's six tests, seldom all
    rows_file = tmp_path / "code.jsonl"
    train = (ROOT / "tasks" / "data" / "code" / "train.jsonl").read_text().splitlines()
    rows_file.write_text("\n".join(train[:ROWS]) + "\n")
    run = tmp_path / "code"
    done = run_rlvr("train", str(CODE), f"run.out_dir={tmp_path}", "run.name=code",
                    f"model.path={code_model}", "run.wandb=disabled", "run.progress=false",
                    f"task.train_path={rows_file}", f"task.eval_path={rows_file}", "mode=sync",
                    f"run.steps={STEPS}", "run.eval_every=100", timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = [r for r in read_rows(run) if r["step"] > 0]
    assert len(trained) == STEPS
    assert all(r["reward/errors"] == 0 for r in trained)  # every verdict came from the sandbox
    assert trained[0]["reward/sandbox_started"] > 0  # the first response started it
    # each response's reward is the share of its row's six tests passed: some pass, not all
    passed = sum(r["reward/tests_passed"] for r in trained) / STEPS
    assert 0 < passed < 6
    assert sum(r["reward/sandbox_error"] for r in trained) / STEPS < 0.5
    assert 0 < sum(r["reward/mean"] for r in trained) / STEPS < 1
