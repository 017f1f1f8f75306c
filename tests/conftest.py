"""Shared fixtures: a quickly warm-started tiny model and a way to run `rlvr` as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import settings
from tests.lanes import make_scheduler

# no per-example deadline anywhere: on a shared 2-core machine (a background warm start, a run
# in the next test) the time an example takes says nothing about the property under test
settings.register_profile("rlvr", deadline=None)
settings.load_profile("rlvr")

# One torch thread in every test process that does not choose its own: each xdist worker, and
# the processes a test starts (an `rlvr` run's actors and learner set theirs from the config).
# Two OpenMP threads on a 2-core machine whose other core is busy (the other worker, a warm
# start built in the background at a higher priority) spin at every barrier waiting for the
# descheduled one: tests/test_update_steps.py took 149 s beside one busy process at nice -10,
# 12 s with one thread, 11 s on an idle machine. torch reads the variable when it is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): set it there too
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

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
    return ensure_warm_start(cfg, log=lambda *_: None, threads=1)


# The full warm starts two configs ship with, in the project's cache (shared with `make demo` and
# `rlvr train`): the demo's (configs/tiny-cpu.yaml, 2,000 supervised steps, 5.3 min of one core) and
# the code task's (configs/tiny-cpu-code.yaml, 800 steps of longer rows, 5.6 min of one AVX-512
# core). When a collected test needs one, it is built in a background process from the start of
# the session, one after the other in this order, on one thread, ahead of the suite's own
# processes (`nice` -10 where the session may raise priority): at the default priority it got a
# tenth of a core beside a loaded suite on a slow machine (the code task's at 4 s a step, not
# 0.4) and finished last, with its test's worker waiting. The fixture waits for its own.
WARM_CACHE = ROOT / ".cache" / "rlvr"
FULL_WARM_STARTS = {"demo_warm_model": TINY,
                    "code_warm_model": ROOT / "configs" / "tiny-cpu-code.yaml"}
_builds: dict[str, dict] = {}  # fixture name -> {"done": Event, "code", "log", "proc"}
_stop_building = threading.Event()


def _ahead() -> None:
    try:
        os.nice(-10)
    except PermissionError:  # not root: the default priority, the build only takes longer
        pass


def _build_in_order(names: list[str]) -> None:
    for name in names:
        build = _builds[name]
        log = WARM_CACHE / f"test-session-warm-start-{name}.log"
        build["log"] = log
        if not _stop_building.is_set():
            with open(log, "w") as out:
                build["proc"] = subprocess.Popen(
                    [sys.executable, "-m", "rlvr.warm_start", str(FULL_WARM_STARTS[name]),
                     f"warm_start.cache_dir={WARM_CACHE}", "--threads", "1"],
                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_ahead)
                build["code"] = build["proc"].wait()
        build["done"].set()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist runs the suite too
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s two xdist workers take the suite in lanes (tests/lanes.py)."""
    return make_scheduler(config, log)


@pytest.hookimpl(trylast=True)  # after -m and -k deselected: what will run
def pytest_collection_modifyitems(config, items):
    # a test on the code task's warm start runs after the rest of its lane: the warm start is
    # built last (every worker orders its collection the same way, as xdist requires)
    items.sort(key=lambda item: "code_warm_model" in getattr(item, "fixturenames", ()))
    # under xdist every worker collects every test: one of them builds
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    needed = [name for name in FULL_WARM_STARTS
              if any(name in getattr(item, "fixturenames", ()) for item in items)]
    if needed:
        WARM_CACHE.mkdir(parents=True, exist_ok=True)
        _builds.update({name: {"done": threading.Event()} for name in needed})
        _builds["_thread"] = threading.Thread(target=_build_in_order, args=(needed,), daemon=True)
        _builds["_thread"].start()


def pytest_unconfigure(config):
    thread = _builds.get("_thread")
    if thread is None:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        thread.join(timeout=1800)  # another worker may still need them: let them finish
        return
    _stop_building.set()  # this session ended before they were needed
    for build in _builds.values():
        if isinstance(build, dict) and build.get("proc") is not None:
            build["proc"].kill()
    thread.join()


def _full_warm_start(name: str) -> Path:
    from protocol.config import load_config
    from rlvr.warm_start import ensure_warm_start

    build = _builds.get(name)
    if build is not None:
        assert build["done"].wait(timeout=1800), f"the background warm start of {name} hangs"
        if build.get("code") not in (0, None):
            log = build["log"].read_text()
            pytest.fail(f"the background warm start of {name} failed (code {build['code']}):\n"
                        f"{log[-3000:]}")
    # found in the cache (built above, or earlier, or by another worker: the warm start's lock
    # waits for it); built here when no collected test asked
    return ensure_warm_start(load_config(FULL_WARM_STARTS[name],
                                         [f"warm_start.cache_dir={WARM_CACHE}"]),
                             log=lambda *_: None, threads=1)


@pytest.fixture(scope="session")
def demo_warm_model() -> Path:
    """The demo's warm start: the model knows the one- and two-digit answers greedily but slips
    at T = 1, and RL removes the slips fast."""
    return _full_warm_start("demo_warm_model")


@pytest.fixture(scope="session")
def code_warm_model() -> Path:
    """The code task's warm start: greedy passes most held-out rows' tests, sampling about half."""
    return _full_warm_start("code_warm_model")


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
