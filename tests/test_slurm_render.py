"""The rendered job scripts (dry run: nothing queued) and the status summary, without SLURM."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from slurm import submit as slurm_submit
from slurm.render import JobSpec, render, time_limit_s
from slurm.roles import REQUEUE_EXIT_CODE
from slurm.submit import format_status, parse_scontrol_job, read_progress, submit


def directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines()
            if line.startswith("#SBATCH ")]


def srun_lines(script: str) -> list[list[str]]:
    return [shlex.split(line.rstrip(" &")) for line in script.splitlines()
            if line.startswith("srun ")]


def homogeneous(**kw) -> str:
    return render(JobSpec(run_dir="/runs/a", nodes=3, learner_ranks_per_node=2, actors_per_node=2,
                          **kw))


def test_a_homogeneous_job_asks_for_every_node_with_room_for_the_busiest_one():
    d = directives(homogeneous(extra_sbatch=("--partition=cpu",)))
    assert "--nodes=3" in d and "--ntasks-per-node=2" in d and "--partition=cpu" in d
    assert "hetjob" not in d


def test_both_shapes_ask_for_requeue_a_preemption_notice_and_an_appended_log():
    for script in (homogeneous(signal_s=120), homogeneous(signal_s=120, hetjob=True)):
        d = directives(script)
        assert "--requeue" in d and "--signal=B:USR1@120" in d and "--open-mode=append" in d
        assert "--output=/runs/a/slurm-%j.out" in d


def test_every_directive_comes_before_the_first_command():
    # sbatch stops reading #SBATCH lines at the first command
    for script in (homogeneous(), homogeneous(hetjob=True)):
        lines = script.splitlines()
        first_command = next(i for i, line in enumerate(lines)
                             if line.strip() and not line.startswith("#"))
        assert max(i for i, line in enumerate(lines) if line.startswith("#SBATCH")) < first_command


def test_learner_ranks_run_on_the_first_nodes_and_actors_on_the_rest():
    learner, actors = srun_lines(homogeneous())
    assert learner[1:6] == ["--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--relative=0",
                            "--cpus-per-task=1"]
    assert actors[1:7] == ["--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--relative=1",
                           "--cpus-per-task=1", "--kill-on-bad-exit=0"]
    assert learner[learner.index("--group") + 1] == "learner"
    assert actors[actors.index("--group") + 1] == "actor"
    for cmd in (learner, actors):
        assert cmd[cmd.index("-m") + 1] == "slurm.role"
        assert cmd[cmd.index("--learner-nodes") + 1] == "1"
        assert cmd[cmd.index("--actors-per-node") + 1] == "2"


def test_a_hetjob_requests_learner_and_actor_nodes_separately():
    script = homogeneous(hetjob=True, learner_sbatch=("--gpus-per-node=8",),
                         actor_sbatch=("--partition=inference",))
    d = directives(script)
    split = d.index("hetjob")
    assert d.count("hetjob") == 1
    assert {"--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=8"} <= set(d[:split])
    assert {"--nodes=2", "--ntasks-per-node=2", "--partition=inference"} <= set(d[split + 1:])
    assert "--gpus-per-node=8" not in d[split + 1:] and "--partition=inference" not in d[:split]
    assert [c[1] for c in srun_lines(script)] == ["--het-group=0", "--het-group=1"]


def test_the_script_requeues_only_on_the_requeue_exit_code_and_forwards_usr1_to_the_learner():
    script = homogeneous()
    requeue = f"if [ $rc -eq {REQUEUE_EXIT_CODE} ]; then exec scontrol requeue $SLURM_JOB_ID; fi"
    assert requeue in script
    assert re.search(r"trap '.*kill -USR1 \$learner' USR1", script)


def test_the_scripts_are_valid_bash():
    for script in (homogeneous(), homogeneous(hetjob=True)):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_overrides_reach_every_task_intact():
    script = homogeneous(overrides=("run.name=a b", "task.kind=file"))
    for cmd in srun_lines(script):
        assert cmd[-2:] == ["run.name=a b", "task.kind=file"]


@pytest.mark.parametrize("kw, message", [
    (dict(nodes=1), "leaves no node for actors"),
    (dict(nodes=3, time="5:00", signal_s=300), "shorter than the time limit"),
    (dict(nodes=3, time="1h"), "not a SLURM time limit"),
    (dict(nodes=3, learner_nodes=0), "learner_nodes must be >= 1"),
    (dict(nodes=3, run_dir="runs/a"), "must be absolute"),
    (dict(nodes=3, learner_sbatch=("--gpus=8",)), "need hetjob=True"),
    (dict(nodes=3, extra_sbatch=("--x=1\nrm -rf /",)), "one line"),
])
def test_impossible_jobs_are_refused_before_rendering(kw, message):
    with pytest.raises(ValueError, match=message):
        render(JobSpec(**{"run_dir": "/runs/a", **kw}))


@pytest.mark.parametrize("limit, seconds", [
    ("90", 5400), ("1:30", 90), ("2:00:00", 7200), ("1-0", 86400), ("1-2:03", 93780),
    ("1-2:03:04", 93784), ("UNLIMITED", float("inf"))])
def test_time_limits_are_read_as_sbatch_reads_them(limit, seconds):
    assert time_limit_s(limit) == seconds


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("run:\n  name: slurmtest\n  steps: 3\n")
    return path


def test_a_dry_run_returns_the_script_and_writes_nothing(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = submit(config, ["run.steps=5"], nodes=3, actors_per_node=2, dry_run=True)
    run_dir = tmp_path / "runs" / "slurmtest"  # the config's run.out_dir / run.name, absolute
    assert f"--run-dir {run_dir}" in script
    assert not run_dir.exists()


def test_a_bad_config_key_fails_at_submit(config, capsys):
    with pytest.raises(ValueError, match="rollout.no_such_key"):
        submit(config, ["rollout.no_such_key=1"], nodes=3, dry_run=True)
    assert slurm_submit.main(["submit", str(config), "rollout.no_such_key=1", "--nodes", "3",
                              "--dry-run"]) == 2
    assert "rollout.no_such_key" in capsys.readouterr().err


def test_the_cli_prints_a_dry_run(config, tmp_path, capsys):
    code = slurm_submit.main(["submit", str(config), "--nodes", "3", "--actors-per-node", "2",
                              "--hetjob", "--run-dir", str(tmp_path / "r"), "--dry-run",
                              "--sbatch=--partition=cpu", "--learner-sbatch=--gpus-per-node=1"])
    out = capsys.readouterr().out
    assert code == 0 and "#SBATCH hetjob" in out and "#SBATCH --partition=cpu" in out
    assert f"--run-dir {tmp_path / 'r'}" in out


def test_status_reads_the_job_line_and_the_progress(tmp_path):
    line = ("JobId=7 JobName=rlvr-a UserId=root(0) JobState=RUNNING Reason=None Restarts=1 "
            "ExitCode=0:0 RunTime=00:01:02 TimeLimit=01:00:00 NodeList=c[1-3] "
            f"Command={tmp_path}/job.sbatch")
    jobs = parse_scontrol_job(line + "\n")
    rows = [{"step": 1, "eval/avg@8": 0.25, "actors/groups_by_actor": {"0": 3, "1": 4}},
            {"step": 2}, {"step": 3, "eval/avg@8": 0.5}]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo')  # torn
    progress = read_progress(metrics)
    assert progress == {"step": 3, "eval": (3, 0.5), "groups_by_actor": {"0": 3, "1": 4}}
    text = format_status("7", jobs, progress, tmp_path)
    assert "job 7: RUNNING, restarts 1" in text and "nodes c[1-3]" in text
    assert "step 3, eval/avg@8 0.500 (step 3), groups by actor 0:3 1:4" in text


def test_status_of_an_unknown_job_and_a_run_without_metrics(tmp_path):
    text = format_status("99", [], read_progress(tmp_path / "metrics.jsonl"), tmp_path)
    assert "unknown to slurmctld" in text and "no metrics yet" in text


def test_submit_refuses_a_run_folder_that_already_holds_a_run(config, tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ValueError, match="already holds a run"):
        submit(config, [], nodes=2, run_dir=tmp_path / "r", dry_run=True)
