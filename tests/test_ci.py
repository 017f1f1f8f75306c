"""What CI promises: a real component that cannot start fails the run there, instead of skipping."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.slurm_cluster import cannot_run


def test_under_ci_a_component_that_cannot_start_fails(monkeypatch):
    monkeypatch.setenv("RLVR_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="no SLURM cluster: needs root"):
        cannot_run("no SLURM cluster: needs root")


def test_elsewhere_it_skips_with_its_reason(monkeypatch):
    monkeypatch.delenv("RLVR_CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        cannot_run("no SLURM cluster: needs root")


LANE_FILES = {"test_e2e.py": "busy", "test_bench.py": "busy", "test_slurm_cluster.py": "slurm",
              "test_sweep_slurm.py": "slurm", "test_sandbox.py": "sandbox",
              "test_code_e2e.py": "sandbox", "test_codec.py": None, "test_plan.py": None,
              "test_gpu_check.py": None}


def test_make_test_runs_each_lane_whole_on_one_worker(tmp_path):
    # a small suite with the lanes' file names, each test noting its worker and file, run on
    # two xdist workers through the project's scheduler (tests/lanes.py) as `make test` does
    for name in LANE_FILES:
        (tmp_path / name).write_text(
            "import os, time, pytest\n"
            "@pytest.mark.parametrize('i', range(4))\n"
            "def test_note(i):\n"
            "    with open('ran.log', 'a') as f:\n"
            f"        f.write(os.environ['PYTEST_XDIST_WORKER'] + ' {name}\\n')\n"
            "    time.sleep(0.05)\n")
    (tmp_path / "conftest.py").write_text(
        "from tests.lanes import make_scheduler\n\n"
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    return make_scheduler(config, log)\n")
    # the inner suite runs with exactly these options: PYTEST_ADDOPTS of the outer run (a plugin
    # loaded, a -k) would change what it runs or fail it for a reason not its own
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadscope",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [line.split() for line in (tmp_path / "ran.log").read_text().splitlines()]
    assert len(ran) == 4 * len(LANE_FILES)
    for lane in ("busy", "slurm", "sandbox"):
        workers = {w for w, name in ran if LANE_FILES[name] == lane}
        assert len(workers) == 1, (lane, ran)
    for name in LANE_FILES:  # a file is never split either
        assert len({w for w, n in ran if n == name}) == 1, (name, ran)
    # the longest lanes first (tests/lanes.py LONGEST_FIRST): the busy lane on one worker, the
    # GPU check's dry run on the other (by their number of tests, they would start last)
    firsts = {w: next(n for v, n in ran if v == w) for w, _ in ran}  # each worker's first file
    assert sorted(LANE_FILES[n] or n for n in firsts.values()) == ["busy", "test_gpu_check.py"], \
        firsts
