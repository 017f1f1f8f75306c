"""Shared fixtures: a quickly warm-started tiny model and a way to run `rlvr` as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from tests.lanes import make_scheduler

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


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist runs the suite too
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s two xdist workers take the suite in lanes (tests/lanes.py)."""
    return make_scheduler(config, log)


def pytest_collection_modifyitems(config, items):
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


def run_rlvr(*args: str, timeout_s: float = 240, env: dict | None = None
             ) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true", **(env or {})}
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
