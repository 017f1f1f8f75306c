"""`rlvr sweep --slurm` on the real single-machine SLURM cluster (tests/slurm_cluster.py): four
settings, four jobs queued as `rlvr slurm submit` queues them, real learner and actor processes,
one table when they have finished."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY, run_rlvr
from tests.slurm_cluster import slurm_cluster_fixture  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_sweep_of_two_settings_runs_as_slurm_jobs_and_makes_its_table(slurm_cluster, tmp_path,
                                                                        tiny_model):
    # two settings, one per node, at once: a grid of several keys is tests/test_sweep.py's
    out = tmp_path / "sweep"
    args = ["sweep", str(TINY), "max_staleness=0,2",
            f"model.path={tiny_model}", "run.steps=3", "run.eval_every=3",
            "task.eval_per_level=8", "rollout.prompts_per_step=8", "rollout.prompts_per_work=4",
            "--slurm", "--nodes", "2", "--time", "10:00", "--wait", "--poll-s", "1",
            "--out", str(out)]
    done = run_rlvr(*args, timeout_s=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("sweep: queued ") == 2
    rows = [line for line in done.stdout.splitlines() if line.startswith("| max_staleness=")]
    assert len(rows) == 2
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == "3"  # every run trained its 3 steps
        assert float(cells[2]) > 0 and float(cells[3].replace(",", "")) > 0  # steps/min, responses
        assert 0 <= float(cells[5]) <= 1  # held-out eval/avg@8 at the end
    # each run was a SLURM job of its own, with the job's log in its run folder
    jobs = set()
    for run_dir in sorted((out / "runs").iterdir()):
        job = json.loads((run_dir / "sweep_job.json").read_text())["job_id"]
        jobs.add(job)
        assert (run_dir / f"slurm-{job}.out").exists() and (run_dir / "summary.json").exists()
        state, code = slurm_cluster.wait_job(job, timeout_s=5)
        assert (state, code) == ("COMPLETED", "0:0"), slurm_cluster.context(job)
    assert len(jobs) == 2
    status = run_rlvr("sweep", "--status", "--out", str(out))
    assert status.returncode == 0 and "2/2 runs done" in status.stdout
    assert status.stdout.count("COMPLETED") == 2
    # the same command again queues nothing: every run is finished
    again = run_rlvr(*args, timeout_s=120)
    assert again.returncode == 0 and "sweep: queued" not in again.stdout
    assert again.stdout.count("reusing finished run") == 2
