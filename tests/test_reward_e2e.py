"""A reward function of the user's, from a module of their own, trains a real run: its reward
rises, its named scores are logged, its errors are counted while the run goes on; a bad name
stops `rlvr train` in one line before any process starts."""

from __future__ import annotations

import textwrap

import pytest

from tests.calibration import record, run_seed
from tests.conftest import TINY, read_rows, run_rlvr

# The user's module: their own answer check, a named score, and an error on the level-3
# prompts (a tenth of the tiny task's), which reads the prompt's fields.
PLUGIN = textwrap.dedent('''
    def boxed_answer(response, answer, fields):
        if fields["level"] == 3:
            raise RuntimeError("level 3 is not mine to judge")
        boxed = response.rsplit("\\\\boxed{", 1)[-1].split("}")[0] if "\\\\boxed{" in response else None
        return {"reward": float(boxed == answer), "boxed": float(boxed is not None)}
''')

# The gain is the held-out evaluation's (eval/avg@8 over the task's 192 problems, at step 0 and
# the last): both evaluations draw the same random numbers (tasks/evaluation.py), so with learning
# off the gain is 0 exactly and its spread over seeds is the training's alone; the bound is
# calibrated in tests/README.md. The run is sync: async, what a step trains depends on which
# groups arrive first, which the suite's load moves.
STEPS, MIN_GAIN = 120, 0.09


@pytest.mark.slow
def test_a_reward_function_of_the_users_trains_logs_its_scores_and_survives_its_errors(
        tmp_path, demo_warm_model):
    (tmp_path / "my_reward.py").write_text(PLUGIN)
    run_dir = tmp_path / "runs" / "own"
    out = run_rlvr("train", str(TINY), f"run.out_dir={run_dir.parent}", "run.name=own",
                   f"model.path={demo_warm_model}", "run.wandb=disabled", "run.progress=false",
                   f"run.steps={STEPS}", f"run.eval_every={STEPS}",
                   "mode=sync", f"run.seed={run_seed()}",
                   "task.reward=my_reward:boxed_answer", env={"PYTHONPATH": str(tmp_path)},
                   timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in read_rows(run_dir) if "reward/mean" in r]
    assert len(rows) == STEPS
    assert all(0.5 < r["reward/boxed"] <= 1 for r in rows)  # the warm start boxes its answers
    errors = sum(r["reward/errors"] for r in rows)
    responses = sum(r["gen/responses_per_step"] for r in rows)
    # each response to a level-3 prompt is an error: a tenth of the prompts, but all wrong, they
    # draw more responses than the others (0.16 of them in a 120-step run)
    assert 0.1 < errors / responses < 0.6, (errors, responses)
    evals = [r for r in read_rows(run_dir) if "eval/avg@8" in r]
    assert [r["step"] for r in evals] == [0, STEPS]
    gain = evals[-1]["eval/avg@8"] - evals[0]["eval/avg@8"]
    record("eval/avg@8 gain over the run", gain, low=MIN_GAIN)
    assert gain > MIN_GAIN, [r["eval/avg@8"] for r in evals]
    log = (run_dir / "logs" / "actor-0.log").read_text()
    assert log.count("RuntimeError: level 3 is not mine to judge") == 1  # logged once, counted


def test_a_reward_name_that_does_not_import_stops_train_in_one_line(tmp_path):
    out = run_rlvr("train", str(TINY), "task.reward=no_such_module:reward",
                   f"run.out_dir={tmp_path}", "run.name=refused")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line == ("rlvr: config error: task.reward: 'no_such_module:reward' cannot be "
                    "imported: ModuleNotFoundError: No module named 'no_such_module'")
    assert not (tmp_path / "refused" / "logs").exists()
