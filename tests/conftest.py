"""Shared fixtures: a quickly warm-started tiny model and a way to run `rlvr` as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from rlvr.launch import SPAWNER_ENV
from tests.forkserver import Server
from tests.lanes import make_scheduler

# no per-example deadline anywhere: on a shared 2-core machine (the other worker's training runs)
# the time an example takes says nothing about the property under test
settings.register_profile("rlvr", deadline=None)
settings.load_profile("rlvr")

# One torch thread in every test process that does not choose its own: each xdist worker, and
# the processes a test starts (an `rlvr` run's actors and learner set theirs from the config).
# Two OpenMP threads on a 2-core machine whose other core is busy (the other worker's runs) spin
# at every barrier waiting for the descheduled one: tests/test_update_steps.py took 149 s beside
# one busy high-priority process, 12 s with one thread, 11 s on an idle machine. torch reads the
# variable when it is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): set it there too
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny-cpu.yaml"
CODE = ROOT / "configs" / "tiny-cpu-code.yaml"


def _short_warm_start(tmp_path_factory, config: Path, steps: int) -> Path:
    from protocol.config import load_config
    from rlvr.warm_start import ensure_warm_start

    # one cache for the whole session: under xdist each worker has its own base temp, and the
    # warm start's lock makes the second worker wait for the first's model
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "warm"
    cfg = load_config(config, [f"warm_start.cache_dir={cache}", f"warm_start.steps={steps}"])
    return ensure_warm_start(cfg, log=lambda *_: None, threads=1)


# The suite trains from short warm starts, built in the session (a minute or three of one core):
# enough for mixed groups and for learning to show on the problems a run trains on. How much the
# configs' full warm starts learn on held-out problems (2,000 and 800 steps, half an hour of one
# core together) is measured in BENCHMARKS.md, not in CI.
@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny model after 60 warm-start steps: it boxes its answers, seldom the right one."""
    return _short_warm_start(tmp_path_factory, TINY, 60)


@pytest.fixture(scope="session")
def code_model(tmp_path_factory) -> Path:
    """The code task's model after 150 warm-start steps: its functions pass some of a row's
    tests, seldom all six."""
    return _short_warm_start(tmp_path_factory, CODE, 150)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist runs the suite too
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s two xdist workers take the suite in lanes (tests/lanes.py)."""
    return make_scheduler(config, log)


FORK_SERVER = Server(Path(tempfile.mkdtemp(prefix="rlvr-forkserver-")))


def rlvr_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a test's `rlvr` command: its learner and actors start from this test
    process's fork server (tests/forkserver.py), unless `env` or the suite's environment sets
    RLVR_SPAWNER to '' (`python -m` processes, as a user's run starts them)."""
    served = {} if os.environ.get(SPAWNER_ENV) == "" else FORK_SERVER.env()
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true", **served,
            **(env or {})}


def run_rlvr(*args: str, timeout_s: float = 240, env: dict | None = None
             ) -> subprocess.CompletedProcess:
    env = rlvr_env(env)
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def quick_run_args(run_dir: Path, model: Path, *overrides: str) -> list[str]:
    """A few-step run of the tiny config in `run_dir` (tmp), small enough for CI."""
    return ["train", str(TINY), f"run.out_dir={run_dir.parent}", f"run.name={run_dir.name}",
            f"model.path={model}", "run.wandb=disabled", "run.progress=false",
            "task.eval_per_level=8", "rollout.prompts_per_step=8", "rollout.prompts_per_work=4",
            *overrides]


# Four sums the short warm start (`tiny_model`) gets right about 5% of the time when sampling:
# a run that trains on them and evaluates on them sees every kind of group (all-fail, mixed,
# repeated) within a few steps, and learning shows within tens of steps.
FEW = [("8-2=", "6"), ("8+1=", "9"), ("3+0=", "3"), ("6-5=", "1")]


def few_problems(tmp_path: Path, extra_rows: tuple[dict, ...] = ()) -> list[str]:
    """Overrides that train on FEW (with `extra_rows` added to the training file) and evaluate
    on FEW."""
    rows = [{"prompt": q, "answer": a, "solution": f"\\boxed{{{a}}}"} for q, a in FEW]
    train, held = tmp_path / "few-train.jsonl", tmp_path / "few.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train.write_text("".join(json.dumps(r) + "\n" for r in [*rows, *extra_rows]))
    return ["task.kind=file", f"task.train_path={train}", f"task.eval_path={held}"]


def eval_gain(rows: list[dict], metric: str, steps: int) -> float:
    """`metric` at the last step minus at step 0, after checking that those are the run's two
    evaluations. Both draw the same random numbers (tasks/evaluation.py), so with learning off
    the gain is 0 exactly and its spread over seeds is the training's alone."""
    evals = [(r["step"], r[metric]) for r in rows if metric in r]
    assert [step for step, _ in evals] == [0, steps], evals
    return evals[1][1] - evals[0][1]


def assert_admitted_within_bound(rows: list[dict], groups_per_step: int, bound: int) -> int:
    """Admission's bound (docs/ALGORITHMS.md 8.2), read from what was trained: with no slot released
    (nothing dropped, no DAPO batches), group g<i> took admission slot i, which opens only once
    the actors hold version ceil((i + 1) / G) - bound - 1, so its first token was sampled by
    that version or a later one. Fails when admission runs ahead (or a resume miscounts its
    slots); returns how many groups were checked."""
    checked = 0
    for r in rows:
        for gid, first in zip(r.get("groups/trained_ids", []),
                              r.get("groups/trained_first_versions", []), strict=True):
            i = int(gid[1:])
            opens_at = -(-(i + 1) // groups_per_step) - bound - 1
            assert first >= opens_at, (f"{gid} sampled by version {first}, but its slot opens "
                                       f"at version {opens_at} (step {r['step']})")
            checked += 1
    return checked


def groups_trained_behind(rows: list[dict]) -> int:
    """How many trained groups were sampled by weights older than the learner's (step s trains
    version s - 1), by the audit of their first tokens' versions: an async actor ran ahead."""
    return sum(r["step"] - 1 - v >= 1 for r in rows for v in r["groups/trained_first_versions"])


def assert_on_policy(rows: list[dict]) -> None:
    """A sync run's actors sampled with exactly the weights the learner trains: the decoupled
    weight is 1 (float error) on every step with a row carrying gradient (a nonzero advantage),
    null exactly on the steps with none, and at least one step had one (so the check could
    fail)."""
    trained = [r for r in rows if r["groups/frac_zero_adv_final"] < 1]
    assert trained, "no step had a row carrying gradient: nothing to check"
    for r in rows:
        assert (r["is/w_mean"] is None) == (r["groups/frac_zero_adv_final"] == 1), r["step"]
    for r in trained:  # each token's weight, not only their mean (off-policy, it is near 1 too)
        assert abs(r["is/w_mean"] - 1.0) < 1e-3, (r["step"], r["is/w_mean"])
        assert r["is/w_absdev"] < 1e-3, (r["step"], r["is/w_absdev"])


def pytest_terminal_summary(terminalreporter):
    """The CPU and torch's kernel path, last, where a CI log's tail shows them: learning tests
    start from warm starts that differ by kernel path, so a failed bound is read beside them."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines
                  if line.startswith("model name")), "unknown")
    terminalreporter.write_line(f"machine: {model}, {os.cpu_count()} cores, torch CPU kernels "
                                f"{torch.backends.cpu.get_cpu_capability()}")
