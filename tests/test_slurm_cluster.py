"""Jobs on a real SLURM cluster (3 emulated nodes, started by the fixture): `slurm.submit` queues
the rendered script, `slurm.role` runs on every task and execs the probe (tests/slurm_cluster.py)
in place of the learner and actor entry points; the probe records what each task was told."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from slurm.submit import status, submit
from tests.slurm_cluster import slurm_cluster_fixture  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def run(tmp_path, slurm_cluster, tiny_model):
    """Submit a run whose processes are the probe; returns (submit(**kw) -> job id, run dir).
    The model is the session's warm start: without model.path, submit would warm-start the
    default tiny model on the submit host (2,000 steps, 5 minutes of the suite) for a probe."""
    config = tmp_path / "cfg.yaml"
    config.write_text(f"run:\n  name: probe\n  steps: 3\nmodel:\n  path: {tiny_model}\n")
    run_dir = tmp_path / "run"

    def go(mode: str = "", **kw) -> str:
        env = {**os.environ, "RLVR_SLURM_EXEC": slurm_cluster.write_probe(tmp_path),
               "PROBE_MODE": mode}
        kw = {"time": "10:00", "signal_s": 60, **kw}  # no notice unless a test asks for one
        return submit(config, [], run_dir=run_dir, env=env, **kw)
    return go, run_dir


def records(run_dir: Path, restart: int = 0) -> dict[tuple[str, int], dict]:
    out = {}
    for path in (run_dir / "probe").glob(f"*-r{restart}.json"):
        r = json.loads(path.read_text())
        out[(r["kind"], r["index"])] = r
    return out


def test_a_homogeneous_job_gives_every_task_its_role_and_learner_address(slurm_cluster, run):
    submit_, run_dir = run
    job = submit_(nodes=3, learner_ranks_per_node=2, actors_per_node=2)
    assert slurm_cluster.wait_job(job, timeout_s=60) == ("COMPLETED", "0:0"), \
        slurm_cluster.context(job)
    rec = records(run_dir)
    assert sorted(rec) == [("actor", 0), ("actor", 1), ("actor", 2), ("actor", 3),
                           ("learner", 0), ("learner", 1)]
    c1 = slurm_cluster.node_addrs["c1"]  # NodeAddr of the first node, from scontrol
    ports = {(r["overrides"]["net.master_port"], r["overrides"]["net.zmq_port"],
              r["overrides"]["net.weights_port"]) for r in rec.values()}
    assert len(ports) == 1  # every task agrees on the ports
    for (kind, i), r in rec.items():
        assert r["overrides"]["net.learner_host"] == c1
        assert r["overrides"]["actors.count"] == "4" and r["overrides"]["learner.ranks"] == "2"
        assert r["argv"][r["argv"].index("--run-dir") + 1] == str(run_dir)
        if kind == "learner":
            assert r["env"]["SLURMD_NODENAME"] == "c1"
            assert (r["env"]["MASTER_ADDR"], r["env"]["RANK"], r["env"]["WORLD_SIZE"],
                    r["env"]["LOCAL_RANK"]) == (c1, str(i), "2", str(i))
            assert r["env"]["MASTER_PORT"] == r["overrides"]["net.master_port"]
            assert r["overrides"]["net.bind_host"] == "0.0.0.0"
        else:
            assert r["env"]["SLURMD_NODENAME"] == f"c{2 + i // 2}"  # 2 actors per actor node
            assert r["argv"][r["argv"].index("--actor-id") + 1] == str(i)
            assert r["env"]["MASTER_ADDR"] is None
    # the resolved config and the script are in the run folder; status finds it from the job
    assert (run_dir / "config.yaml").exists() and (run_dir / "job.sbatch").exists()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "eval/avg@8": 0.375}\n')
    text = status(job)
    assert f"job {job}: COMPLETED" in text and "step 2, eval/avg@8 0.375 (step 2)" in text


def test_a_hetjob_runs_learner_and_actors_as_two_components(slurm_cluster, run):
    submit_, run_dir = run
    # the learner component is pinned to the last node, so its address is not the first node's
    job = submit_(nodes=3, hetjob=True, learner_ranks_per_node=2, actors_per_node=2,
                  learner_sbatch=["--nodelist=c3"])
    state = slurm_cluster.wait_job(job, timeout_s=60)
    assert state == ("COMPLETED", "0:0"), slurm_cluster.context(job)
    rec = records(run_dir)
    assert sorted(rec) == [("actor", 0), ("actor", 1), ("actor", 2), ("actor", 3),
                           ("learner", 0), ("learner", 1)]
    c3 = slurm_cluster.node_addrs["c3"]
    assert {r["overrides"]["net.learner_host"] for r in rec.values()} == {c3}
    assert {r["env"]["SLURMD_NODENAME"] for (k, _), r in rec.items() if k == "learner"} == {"c3"}
    actor_nodes = {r["env"]["SLURMD_NODENAME"] for (k, _), r in rec.items() if k == "actor"}
    assert actor_nodes == {"c1", "c2"}
    assert {r["overrides"]["actors.count"] for r in rec.values()} == {"4"}
    assert {r["env"]["MASTER_ADDR"] for (k, _), r in rec.items() if k == "learner"} == {c3}
    text = status(job)  # one line per component
    assert f"job {job} component 0: COMPLETED" in text and "nodes c3" in text
    assert f"job {job} component 1: COMPLETED" in text and "nodes c[1-2]" in text


def test_a_hetjob_stops_lingering_actors_when_the_learner_is_done(slurm_cluster, run):
    submit_, run_dir = run
    job = submit_("actors-linger", nodes=2, hetjob=True, actors_per_node=2)
    assert slurm_cluster.wait_job(job, timeout_s=60) == ("COMPLETED", "0:0"), \
        slurm_cluster.context(job)
    assert sorted(p.name for p in (run_dir / "probe").glob("actor-*-term")) == \
        ["actor-0-r0-term", "actor-1-r0-term"]  # the actors got SIGTERM, not SIGKILL
    slurm_cluster.wait_no_processes(job, str(run_dir.parent / "probe.py"))


def test_a_preempted_learner_is_requeued_and_resumes(slurm_cluster, run):
    submit_, run_dir = run
    job = submit_("requeue,actors-linger", nodes=2, actors_per_node=1)
    probe = run_dir / "probe"
    slurm_cluster.wait_for("the learner probe to be ready",
                           lambda: (probe / "learner-0-r0-ready").exists(), 60, job)
    slurm_cluster.preempt_and_requeue(job, requeue_timeout_s=30)
    assert slurm_cluster.wait_job(job, timeout_s=60) == ("COMPLETED", "0:0"), \
        slurm_cluster.context(job)

    assert (probe / "learner-0-r0-usr1").exists()  # the learner got the notice ...
    assert not list(probe.glob("actor-*-usr1"))  # ... and the actors did not
    assert (probe / "actor-0-r0-term").exists()  # they were stopped after the learner exited 3
    second = records(run_dir, restart=1)
    assert second[("learner", 0)]["env"]["SLURM_RESTART_COUNT"] == "1"
    assert "--resume" in second[("learner", 0)]["argv"]
    assert second[("actor", 0)]["env"]["SLURM_RESTART_COUNT"] == "1"
    slurm_cluster.wait_no_processes(job, str(run_dir.parent / "probe.py"))
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert f"job {job} restart 0" in log and f"job {job} restart 1" in log
    assert "learner step exited 3" in log and "learner step exited 0" in log


def test_the_time_limit_itself_sends_the_learner_its_preemption_notice(slurm_cluster, run):
    submit_, run_dir = run
    # a 2-minute limit with the notice 110 s before it: slurmctld sends USR1 to the batch shell
    # about 10 s in (it checks time limits every ~30 s, so allow for that)
    job = submit_("requeue", nodes=2, time="2:00", signal_s=110)
    probe = run_dir / "probe"
    slurm_cluster.wait_for("the learner to get USR1 from --signal",
                           lambda: (probe / "learner-0-r0-usr1").exists(), 75, job)
    slurm_cluster.wait_for("the job to be requeued",
                           lambda: slurm_cluster.job_lines(job)[0].get("Restarts") == "1", 30, job)
    slurm_cluster.hurry(job)
    assert slurm_cluster.wait_job(job, timeout_s=60) == ("COMPLETED", "0:0"), \
        slurm_cluster.context(job)
    assert (probe / "learner-0-r1.json").exists()


def submit_with_cli(*args: str) -> str:
    """`rlvr slurm submit ...` as a user types it; returns the job id it prints."""
    import sys

    done = subprocess.run([sys.executable, "-m", "rlvr.cli", "slurm", "submit", *args],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1].split()[-1]


def test_a_real_async_run_is_preempted_requeued_and_resumes_without_gaps(slurm_cluster, tmp_path,
                                                                           tiny_model):
    from tests.conftest import TINY, assert_admitted_within_bound, quick_run_args, read_rows

    run_dir = tmp_path / "real"
    steps = 30
    overrides = quick_run_args(run_dir, tiny_model, "algorithm=grpo", "mode=async",
                               "max_staleness=1", f"run.steps={steps}", "run.eval_every=100",
                               "run.checkpoint_every=100", "actors.heartbeat_s=0.5",
                               "actors.heartbeat_timeout_s=6",
                               # a kill inside a broadcast stalls it this long (default 120 s)
                               "weight_sync.timeout_s=20")[2:]  # [2:]: past "train CONFIG"
    job = submit_with_cli(str(TINY), *overrides, "--nodes", "3", "--actors-per-node", "1",
                          "--run-dir", str(run_dir), "--time", "10:00", "--signal-s", "60")
    metrics = run_dir / "metrics.jsonl"
    slurm_cluster.wait_for("three learner steps", lambda: metrics.exists() and len(
        metrics.read_text().splitlines()) >= 4, 240, job)
    # the learner checkpoints after the step in progress, exits 3, and the job requeues
    first_pids = {a["pid"] for a in _actors(run_dir)}
    slurm_cluster.preempt_and_requeue(job, requeue_timeout_s=120)
    # after the restart, one actor is SIGKILLed: the run goes on with the other to the end
    victim = slurm_cluster.wait_for("the requeued actors to hold weights", lambda: next(
        (a["pid"] for a in _actors(run_dir) if a["weight_rank"] and a["pid"] not in first_pids
         and a["id"] == "1"), None), 120, job)
    resumed_at = len(metrics.read_text().splitlines())
    # killed once the resumed run trains (not inside its first broadcast, which would wait
    # weight_sync.timeout_s for the dead peer)
    slurm_cluster.wait_for("a step after the requeue", lambda: len(
        metrics.read_text().splitlines()) > resumed_at, 120, job)
    os.kill(victim, 9)
    assert slurm_cluster.wait_job(job, timeout_s=300) == ("COMPLETED", "0:0"), \
        slurm_cluster.context(job)

    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))  # no gap or repeat on requeue
    assert rows[-1]["faults/actors_lost"] == 1 and rows[-1]["actors/live"] == 1
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert "learner step exited 3" in log and "learner step exited 0" in log
    trained = [r for r in rows if r["step"] > 0]
    # no group dropped, and every group was handed out within admission's bound (1), also
    # after the requeue (its admission slots come from the checkpoint)
    assert all(r["gen/responses_dropped_stale"] == 0 for r in trained)
    assert assert_admitted_within_bound(rows, 8, bound=1) == 8 * steps
    # groups came from both actor nodes (actors 0 and 1 sit on c2 and c3 by the layout)
    by_actor: dict[str, int] = {}
    for r in trained:
        for actor, n in r["actors/groups_by_actor"].items():
            by_actor[actor] = by_actor.get(actor, 0) + n
    assert set(by_actor) == {"0", "1"} and min(by_actor.values()) > 0


def test_a_node_failure_before_the_first_checkpoint_requeues_into_a_clean_new_run(
        slurm_cluster, tmp_path, tiny_model):
    """The learner's node fails (its process SIGKILLed, no checkpoint written yet) and SLURM
    requeues the job, as it does for a --requeue job on a failed node: the new run gets
    `--resume`, finds no checkpoint, sets the first attempt's rows aside and starts at step 0."""
    import signal

    from tests.conftest import TINY, quick_run_args, read_rows

    run_dir = tmp_path / "nodefail"
    steps = 8
    overrides = quick_run_args(run_dir, tiny_model, "algorithm=grpo", "mode=async",
                               "max_staleness=1", f"run.steps={steps}", "run.eval_every=100",
                               "run.checkpoint_every=100", "actors.heartbeat_s=0.5",
                               "actors.heartbeat_timeout_s=6")[2:]
    job = submit_with_cli(str(TINY), *overrides, "--nodes", "2", "--actors-per-node", "1",
                          "--run-dir", str(run_dir), "--time", "10:00", "--signal-s", "60")
    metrics = run_dir / "metrics.jsonl"
    slurm_cluster.wait_for("three learner steps", lambda: metrics.exists() and len(
        metrics.read_text().splitlines()) >= 4, 240, job)
    learner = json.loads((run_dir / "processes.json").read_text())["learner"]["pid"]
    os.kill(learner, signal.SIGKILL)
    slurm_cluster.wait_for("the learner to be gone", lambda: _gone(learner), 30, job)
    first_attempt = metrics.read_text()  # nobody writes it again until the requeued learner
    assert not any((run_dir / "checkpoints").glob("step_*"))
    subprocess.run(["scontrol", "requeue", job], check=True)  # what slurmctld does on NODE_FAIL
    slurm_cluster.wait_for("the job to be requeued", lambda: (
        slurm_cluster.job_lines(job) or [{}])[0].get("Restarts") == "1", 60, job)
    slurm_cluster.wait_for("the requeued job to be pending", lambda: (
        slurm_cluster.job_lines(job) or [{}])[0].get("JobState") == "PENDING", 60, job)
    slurm_cluster.hurry(job)
    assert slurm_cluster.wait_job(job, timeout_s=300) == ("COMPLETED", "0:0"), \
        slurm_cluster.context(job)

    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))  # a clean run, step 0 on
    trained = [gid for r in rows for gid in r.get("groups/trained_ids", [])]
    assert len(trained) == len(set(trained))
    aside = list((run_dir / "set-aside").iterdir())
    assert len(aside) == 1 and (aside[0] / "metrics.jsonl").read_text() == first_attempt
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert f"job {job} restart 1" in log and "learner step exited 0" in log


def _gone(pid: int) -> bool:
    try:
        return ") Z " in Path(f"/proc/{pid}/stat").read_text()  # a zombie: dead, not reaped
    except OSError:
        return True


def _actors(run_dir: Path) -> list[dict]:
    try:
        actors = json.loads((run_dir / "processes.json").read_text())["actors"]
    except (FileNotFoundError, ValueError, KeyError):
        return []
    return [{"id": i, **a} for i, a in actors.items()]


def test_a_real_hetjob_run_with_learner_ranks_on_two_nodes_completes(slurm_cluster, tmp_path,
                                                                     tiny_model):
    from tests.conftest import TINY, assert_on_policy, quick_run_args, read_rows

    run_dir = tmp_path / "het"
    overrides = quick_run_args(run_dir, tiny_model, "algorithm=grpo", "mode=sync",
                               "run.steps=2", "run.eval_every=100")[2:]
    # two learner nodes with one rank each: DeepSpeed's gloo group spans the nodes' addresses
    job = submit_with_cli(str(TINY), *overrides, "--nodes", "3", "--learner-nodes", "2",
                          "--actors-per-node", "1", "--hetjob", "--run-dir", str(run_dir),
                          "--time", "10:00", "--signal-s", "60")
    assert slurm_cluster.wait_job(job, timeout_s=240) == ("COMPLETED", "0:0"), \
        slurm_cluster.context(job)
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["learner/ranks"] == 2 for r in rows[1:])
    # sync mode stays exactly on-policy with the update split across the two ranks
    assert_on_policy(rows[1:])
