"""Shared fixtures: a quickly warm-started tiny model and a way to run `rlvr` as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# no per-example deadline anywhere: on a shared 2-core machine (a background warm start, a run
# in the next test) the time an example takes says nothing about the property under test
settings.register_profile("rlvr", deadline=None)
settings.load_profile("rlvr")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny-cpu.yaml"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny model after a short warm start (enough for mixed groups, not for accuracy)."""
    from rlvr.warm_start import ensure_warm_start
    from protocol.config import load_config

    # one cache for the whole session: under xdist each worker has its own base temp, and the
    # warm start's lock makes the second worker wait for the first's model
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "warm"
    cfg = load_config(TINY, [f"warm_start.cache_dir={cache}", "warm_start.steps=60"])
    return ensure_warm_start(cfg, log=lambda *_: None)


# The demo's own warm start (configs/tiny-cpu.yaml: 1,200 supervised steps), in the demo's cache,
# shared with `make demo`. It takes 2.5 min of CPU, so when a collected test needs it, it is
# built in a background process from the start of the session, on one thread, beside tests that
# mostly leave the second core idle; the fixture waits for it.
DEMO_CACHE = ROOT / ".cache" / "rlvr"
DEMO_WARM_START = ["-m", "rlvr.warm_start", str(TINY), f"warm_start.cache_dir={DEMO_CACHE}",
                   "--threads", "1"]
_demo_build: dict = {}


# `make test` runs the suite on two xdist workers (--dist loadgroup). The files that keep both
# cores busy (training runs, benches) form one lane, run one after another on one worker, so that
# two of them never share the cores; every other file (unit tests, and the files that mostly wait:
# on the SLURM daemons and their time limits, a timeout, a vLLM engine's start-up, a child) goes
# whole to whichever worker is free, using the core the busy lane leaves idle. Measured on the whole
# suite run one test after another: 1.55 of 2 cores busy, 465 core-seconds idle. The SLURM files
# share a lane because they share one cluster (a session fixture, per worker).
BUSY_LANE = {"test_algorithms_e2e.py", "test_bench.py", "test_bench_generation.py",
             "test_e2e.py", "test_e2e_learner.py", "test_faults.py", "test_faults_wire.py",
             "test_learner_ranks.py", "test_sweep.py", "test_calibration.py"}
SLURM_LANE = {"test_slurm_cluster.py", "test_sweep_slurm.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        # any other file is a unit of its own: its module fixtures (a vLLM engine) start once
        lane = "busy" if name in BUSY_LANE else "slurm" if name in SLURM_LANE else name
        item.add_marker(pytest.mark.xdist_group(lane))
    # under xdist every worker collects every test: one of them builds
    builder = os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"
    if builder and any("demo_warm_model" in getattr(item, "fixturenames", ()) for item in items):
        DEMO_CACHE.mkdir(parents=True, exist_ok=True)
        log = open(DEMO_CACHE / "test-session-warm-start.log", "w")  # noqa: SIM115
        _demo_build["log"] = log
        _demo_build["proc"] = subprocess.Popen([sys.executable, *DEMO_WARM_START], cwd=ROOT,
                                               stdout=log, stderr=subprocess.STDOUT)


def pytest_unconfigure(config):
    proc = _demo_build.get("proc")
    if proc is not None and proc.poll() is None:  # this session ended before it was needed
        if os.environ.get("PYTEST_XDIST_WORKER"):
            proc.wait(timeout=900)  # another worker may still need it: let it finish
        else:
            proc.kill()
            proc.wait()
    if "log" in _demo_build:
        _demo_build["log"].close()


@pytest.fixture(scope="session")
def demo_warm_model() -> Path:
    """The demo's warm start: the model knows the one- and two-digit answers greedily but slips
    at T = 1, and RL removes the slips fast."""
    from protocol.config import load_config
    from rlvr.warm_start import ensure_warm_start

    proc = _demo_build.get("proc")
    if proc is not None:
        code = proc.wait(timeout=900)
        _demo_build["log"].close()
        log = Path(_demo_build["log"].name).read_text()
        assert code == 0, f"the background warm start failed (code {code}):\n{log[-3000:]}"
    # found in the cache (built above, or earlier, or by another worker: the warm start's lock
    # waits for it); built here when no collected test asked
    return ensure_warm_start(load_config(TINY, [f"warm_start.cache_dir={DEMO_CACHE}"]),
                             log=lambda *_: None)


def run_rlvr(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true"}
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
