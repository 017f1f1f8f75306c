"""A reward function of the user's, from a module of their own, trains a real run: its reward
rises, its named scores are logged, its errors are counted while the run goes on; a bad name
stops `rlvr train` in one line before any process starts."""

from __future__ import annotations

import textwrap

import pytest

from tests.calibration import record, run_seed
from tests.conftest import TINY, eval_gain, few_problems, quick_run_args, read_rows, run_rlvr

# The user's module: their own answer check, a named score, and an error on the prompts of
# level 3, which reads the row's fields.
PLUGIN = textwrap.dedent('''
    def boxed_answer(response, answer, fields):
        if fields.get("level") == 3:
            raise RuntimeError("level 3 is not mine to judge")
        boxed = response.rsplit("\\\\boxed{", 1)[-1].split("}")[0] if "\\\\boxed{" in response else None
        return {"reward": float(boxed == answer), "boxed": float(boxed is not None)}
''')
# trained on tests/conftest.py's FEW and one row of level 3, evaluated on FEW (eval/avg@64 at
# step 0 and the last: tests/conftest.py's eval_gain); sync GRPO: async, what a step trains
# depends on which groups arrive first, which the suite's load moves, and AR3PO's gain on four
# problems spreads over seeds twice as wide. Bound calibrated in tests/README.md.
STEPS, MIN_GAIN = 60, 0.07
LEVEL_3 = {"prompt": "7+7=", "answer": "14", "solution": "\\boxed{14}", "level": 3}


@pytest.mark.slow
def test_a_reward_function_of_the_users_trains_logs_its_scores_and_survives_its_errors(
        tmp_path, tiny_model):
    (tmp_path / "my_reward.py").write_text(PLUGIN)
    run_dir = tmp_path / "runs" / "own"
    out = run_rlvr(*quick_run_args(run_dir, tiny_model, *few_problems(tmp_path, (LEVEL_3,)),
                                   f"run.steps={STEPS}", f"run.eval_every={STEPS}",
                                   "task.eval_samples=64", "mode=sync", "algorithm=grpo",
                                   f"run.seed={run_seed()}",
                                   "task.reward=my_reward:boxed_answer"),
                   env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_rows(run_dir)
    trained = [r for r in rows if "reward/mean" in r]
    assert len(trained) == STEPS
    assert all(0.5 < r["reward/boxed"] <= 1 for r in trained)  # the warm start boxes its answers
    errors = sum(r["reward/errors"] for r in trained)
    responses = sum(r["gen/responses_per_step"] for r in trained)
    # each response to the level-3 row is an error: a fifth of the prompts, eight responses each
    assert 0.1 < errors / responses < 0.3, (errors, responses)
    gain = eval_gain(rows, "eval/avg@64", STEPS)
    record("eval/avg@64 gain over the run", gain, low=MIN_GAIN)
    assert gain > MIN_GAIN
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
