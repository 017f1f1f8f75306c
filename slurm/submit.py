"""Submit a run to SLURM and summarise a submitted one.

    rlvr slurm submit configs/tiny-cpu.yaml run.steps=50 --nodes 3 --actors-per-node 2 [--hetjob]
    rlvr slurm status 1234 [--run-dir runs/demo]

`submit` checks the config and overrides (a bad key fails here, before anything is queued), writes
the resolved config and the rendered job script (`job.sbatch`, see slurm/render.py) into the run
folder and queues it with `sbatch --parsable`. `status` joins what slurmctld says about the job
(`scontrol show job -o`) with the run's progress from `RUN_DIR/metrics.jsonl`.
Without the `rlvr` CLI: `python -m slurm.submit submit ...` / `python -m slurm.submit status ...`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from slurm.render import JobSpec, render

SCRIPT_NAME = "job.sbatch"
EVAL_KEY = "eval/avg@8"
GROUPS_KEY = "actors/groups_by_actor"


# --- the run folder: the one place that knows how a config becomes RUN_DIR/config.yaml -----------

def _load(config_path: str | Path, overrides: Sequence[str]):
    from protocol.config import load_config  # the config schema is the learner's; import late
    return load_config(config_path, list(overrides))


def write_run_config(config, run_dir: Path) -> Path:
    """Write the resolved config to RUN_DIR/config.yaml: the only config the processes read.
    The embedded tiny model is warm-started here (on the submit host, cached) when no
    model.path is given; ports stay as configured (the role launcher derives them per job).
    The learner binds beyond loopback on a cluster, so the run gets CurveZMQ keys (in the run
    folder, which every node sees) unless the config names a key folder already."""
    import dataclasses

    from rlvr.launch import resolve
    from protocol.config import write_resolved
    from protocol.keys import make_keys

    net = config.net
    if not net.curve_dir:
        keys = (Path(run_dir) / "keys").resolve()
        if not keys.exists():
            make_keys(keys)
        net = dataclasses.replace(net, curve_dir=str(keys))
    resolved = resolve(config, log=lambda line: print(line, flush=True))
    resolved = dataclasses.replace(resolved, net=net)  # ports are the job's, not this host's
    return write_resolved(resolved, run_dir)


# --- submit --------------------------------------------------------------------------------------

def submit(config_path: str | Path, overrides: Sequence[str] = (), nodes: int = 2,
           actors_per_node: int = 1, run_dir: str | Path | None = None, hetjob: bool = False,
           dry_run: bool = False, extra_sbatch: Sequence[str] = (), *, learner_nodes: int = 1,
           learner_ranks_per_node: int = 1, time: str = "1:00:00", signal_s: int = 300,
           cpus_per_task: int = 1, job_name: str | None = None,
           learner_sbatch: Sequence[str] = (), actor_sbatch: Sequence[str] = (),
           env: Mapping[str, str] | None = None) -> str:
    """Queue the run; return the job id, or the job script when `dry_run` (then nothing is
    written or queued). `run_dir` defaults to the config's own run folder and must be visible
    from every node (shared filesystem). The overrides are baked into RUN_DIR/config.yaml; the
    actor and learner counts follow from the layout. `env` is sbatch's environment, which the
    job's processes inherit (default: this process's)."""
    spec_args = dict(nodes=nodes, learner_nodes=learner_nodes,
                     learner_ranks_per_node=learner_ranks_per_node, actors_per_node=actors_per_node,
                     hetjob=hetjob, time=time, signal_s=signal_s, cpus_per_task=cpus_per_task,
                     extra_sbatch=tuple(extra_sbatch), learner_sbatch=tuple(learner_sbatch),
                     actor_sbatch=tuple(actor_sbatch))
    shape = JobSpec(run_dir="/", **spec_args)
    shape.validate()
    counts = [f"actors.count={shape.actors}", f"learner.ranks={shape.learner_ranks}"]
    config = _load(config_path, [*overrides, *counts])
    run_dir = Path(run_dir if run_dir is not None else config.run_dir).absolute()
    if (run_dir / "metrics.jsonl").exists():
        raise ValueError(f"run folder {run_dir} already holds a run: choose another run.name "
                         "or --run-dir")
    spec = JobSpec(run_dir=str(run_dir), job_name=job_name or f"rlvr-{run_dir.name}", **spec_args)
    script = render(spec)
    if dry_run:
        return script
    write_run_config(config, run_dir)
    script_path = run_dir / SCRIPT_NAME
    script_path.write_text(script)
    done = subprocess.run(["sbatch", "--parsable", str(script_path)], capture_output=True,
                          text=True, env=None if env is None else dict(env))
    if done.returncode != 0:
        raise RuntimeError(f"sbatch {script_path} failed ({done.returncode}): "
                           f"{done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]  # "id" or "id;cluster"


# --- status --------------------------------------------------------------------------------------

def parse_scontrol_job(text: str) -> list[dict[str, str]]:
    """One dict per line of `scontrol show job -o` (a heterogeneous job has one per component)."""
    jobs = []
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields:
            jobs.append(fields)
    return jobs


def read_progress(metrics_path: Path) -> dict:
    """Last step, last eval/avg@8 (with its step) and last groups-per-actor from metrics.jsonl.
    A torn last line (the learner is writing it) is skipped."""
    progress: dict = {}
    if not metrics_path.exists():
        return progress
    for line in metrics_path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict):
            continue
        if "step" in row:
            progress["step"] = row["step"]
        if row.get(EVAL_KEY) is not None:
            progress["eval"] = (row.get("step"), row[EVAL_KEY])
        if row.get(GROUPS_KEY) is not None:
            progress["groups_by_actor"] = row[GROUPS_KEY]
    return progress


def _groups_text(groups) -> str:
    items = groups.items() if isinstance(groups, dict) else enumerate(groups)
    return " ".join(f"{actor}:{n}" for actor, n in items)


def format_status(job_id: str, jobs: list[dict[str, str]], progress: dict,
                  run_dir: Path | None) -> str:
    """A few lines for a person: SLURM's view of the job, then the run's progress."""
    lines = []
    if not jobs:
        lines.append(f"job {job_id}: unknown to slurmctld (never queued, or finished long ago)")
    for k, job in enumerate(jobs):
        part = f" component {k}" if len(jobs) > 1 else ""
        reason = job.get("Reason", "None")
        lines.append(f"job {job_id}{part}: {job.get('JobState', '?')}"
                     + (f" ({reason})" if reason not in ("None", "(null)") else "")
                     + f", restarts {job.get('Restarts', '0')}, exit {job.get('ExitCode', '?')},"
                     + f" run {job.get('RunTime', '?')} of {job.get('TimeLimit', '?')}"
                     + f", nodes {job.get('NodeList') or '-'}")
    if run_dir is None:
        return "\n".join(lines)
    if not progress:
        lines.append(f"run {run_dir}: no metrics yet")
        return "\n".join(lines)
    text = f"run {run_dir}: step {progress.get('step', '-')}"
    if "eval" in progress:
        step, value = progress["eval"]
        text += f", {EVAL_KEY} {value:.3f} (step {step})" if isinstance(value, (int, float)) \
            else f", {EVAL_KEY} {value} (step {step})"
    if "groups_by_actor" in progress:
        text += f", groups by actor {_groups_text(progress['groups_by_actor'])}"
    lines.append(text)
    return "\n".join(lines)


def status(job_id: str, run_dir: str | Path | None = None) -> str:
    """SLURM state plus run progress. `run_dir` defaults to the folder of the job's script (what
    `submit` queued is RUN_DIR/job.sbatch)."""
    done = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True,
                          text=True)
    jobs = parse_scontrol_job(done.stdout) if done.returncode == 0 else []
    if run_dir is None and jobs and jobs[0].get("Command", "").endswith(SCRIPT_NAME):
        run_dir = Path(jobs[0]["Command"]).parent
    run_dir = None if run_dir is None else Path(run_dir)
    progress = read_progress(run_dir / "metrics.jsonl") if run_dir else {}
    return format_status(str(job_id), jobs, progress, run_dir)


# --- CLI -----------------------------------------------------------------------------------------

def _cmd_submit(args: argparse.Namespace) -> int:
    try:
        out = submit(args.config, args.overrides, nodes=args.nodes,
                     actors_per_node=args.actors_per_node, run_dir=args.run_dir,
                     hetjob=args.hetjob, dry_run=args.dry_run, extra_sbatch=args.sbatch,
                     learner_nodes=args.learner_nodes,
                     learner_ranks_per_node=args.learner_ranks_per_node, time=args.time,
                     signal_s=args.signal_s, cpus_per_task=args.cpus_per_task,
                     learner_sbatch=args.learner_sbatch, actor_sbatch=args.actor_sbatch)
    except (ValueError, RuntimeError) as e:  # ConfigError is a ValueError
        print(f"slurm submit: {e}", file=sys.stderr)
        return 2
    print(out if args.dry_run else f"submitted job {out}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    print(status(args.job_id, args.run_dir))
    return 0


def add_cli(subparsers) -> argparse.ArgumentParser:
    """Add `slurm submit ...` and `slurm status ...`; each sets `func(args) -> exit code`."""
    slurm = subparsers.add_parser("slurm", help="run on a SLURM cluster", description=__doc__)
    sub = slurm.add_subparsers(dest="slurm_command", required=True)
    s = sub.add_parser("submit", help="queue a run as one SLURM job")
    s.add_argument("config", help="YAML run config")
    s.add_argument("overrides", nargs="*", metavar="a.b=value", help="config overrides")
    s.add_argument("--nodes", type=int, required=True, help="total nodes (learner + actor)")
    s.add_argument("--learner-nodes", type=int, default=1)
    s.add_argument("--learner-ranks-per-node", type=int, default=1)
    s.add_argument("--actors-per-node", type=int, default=1)
    s.add_argument("--hetjob", action="store_true",
                   help="heterogeneous job: learner and actor nodes requested separately")
    s.add_argument("--time", default="1:00:00", help="time limit (sbatch --time)")
    s.add_argument("--signal-s", type=int, default=300,
                   help="preemption notice to the learner this many seconds before the limit")
    s.add_argument("--cpus-per-task", type=int, default=1)
    s.add_argument("--sbatch", action="append", default=[], metavar="OPT",
                   help="extra sbatch option for every node, e.g. --sbatch=--partition=gpu")
    s.add_argument("--learner-sbatch", action="append", default=[], metavar="OPT",
                   help="sbatch option for the learner component (--hetjob)")
    s.add_argument("--actor-sbatch", action="append", default=[], metavar="OPT",
                   help="sbatch option for the actor component (--hetjob)")
    s.add_argument("--run-dir", default=None, help="run folder (default: from the config)")
    s.add_argument("--dry-run", action="store_true", help="print the job script, queue nothing")
    s.set_defaults(func=_cmd_submit)
    st = sub.add_parser("status", help="SLURM state and progress of a submitted run")
    st.add_argument("job_id")
    st.add_argument("--run-dir", default=None, help="run folder (default: the job script's folder)")
    st.set_defaults(func=_cmd_status)
    return slurm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.submit")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["slurm", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
