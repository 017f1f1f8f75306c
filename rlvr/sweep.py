"""`rlvr sweep`: every combination of a few config values, each an ordinary run, and one table.

    rlvr sweep configs/tiny-cpu.yaml max_staleness=0,1,2,4 'ar3po.stage_sizes=[2,2],[4,4]' \\
               [run.steps=100 ...] [--seeds K] [--out DIR]
    rlvr sweep CONFIG key=v1,v2 ... --slurm --nodes 2 [--actors-per-node A] [--time T] [--wait]
    rlvr sweep --status [--out DIR]

An override whose value has a comma outside brackets is an axis (`max_staleness=0,2`,
`ar3po.stage_sizes=[2,2],[4,4]`); any other is applied to every run. The runs are the product of
the axes' values (times `run.seed` 0..K-1 with --seeds K), named after their setting, in
`DIR/runs/<name>/` (DIR defaults to runs/sweep), each with wandb off and no progress line. Every
run's config is checked before the first one starts.

Locally the runs train one after another through `rlvr train`'s launcher. With --slurm each is
one job queued as `rlvr slurm submit` queues it (slurm/submit.py), with the layout options given;
--wait polls until every job has ended. A sweep is resumable: a finished run (its last step
logged, summary.json written) is reused, a queued or running job is left alone, and an
interrupted run of this sweep (same arguments, `bench_args.json`) is started again; a run folder
holding anything else stops the sweep, naming it.

When every run has finished, the sweep writes `DIR/sweep.md` (one row per setting; numbers are
means over seeds) and the overlaid curves `DIR/compare_*.png` (rlvr/compare.py: steps/min,
generated responses, held-out accuracy, staleness, reward, responses per prompt), and prints the
table. `--status` shows each run's state from its folder and, for SLURM, its job.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from learner.run_log import read_metrics, write_json_atomic
from rlvr.bench.common import (ARGS_FILE, RUN_FIXED, BenchError, finished, read_json, reusing,
                               shared_model)

PLAN_FILE = "sweep.json"
JOB_FILE = "sweep_job.json"
LIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
               "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED"}


def split_values(text: str) -> list[str]:
    """`0,1,2` -> ['0', '1', '2']; commas inside [] or {} do not split: `[2,2],[4]`."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def parse_overrides(overrides: list[str], axis_keys: tuple[str, ...] = ()
                    ) -> tuple[dict[str, list[str]], list[str]]:
    """(axes: key -> values, fixed overrides). Refuses an empty value and a repeated axis. A key
    in `axis_keys` is an axis even with one value, so that its runs are named by it and a later
    sweep with more values of it extends this one."""
    axes, fixed = {}, []
    for text in overrides:
        key, eq, raw = text.partition("=")
        if not eq or not key.strip():
            raise BenchError(f"{text!r} is not key=value")
        values = split_values(raw)
        if len(values) == 1 and key.strip() not in axis_keys:
            fixed.append(text)
            continue
        if any(v == "" for v in values):
            raise BenchError(f"{text!r}: an empty value in the list")
        if key in axes:
            raise BenchError(f"{key} is swept twice")
        axes[key.strip()] = values
    return axes, fixed


def slug(setting: dict[str, str]) -> str:
    """A folder name for a setting: `max_staleness=2 ar3po.stage_sizes=[2,2]` ->
    `max_staleness-2_ar3po.stage_sizes-2.2`."""
    parts = [f"{k}-{re.sub(r'[^A-Za-z0-9.]+', '.', v).strip('.')}" for k, v in setting.items()]
    return "_".join(parts) or "base"


@dataclass(frozen=True)
class SweepRun:
    name: str
    setting: dict[str, str]
    seed: int | None
    overrides: list[str]


def plan_runs(axes: dict[str, list[str]], fixed: list[str], seeds: int | None) -> list[SweepRun]:
    runs = []
    for values in itertools.product(*axes.values()) if axes else [()]:
        setting = dict(zip(axes, values))
        base = [*fixed, *(f"{k}={v}" for k, v in setting.items())]
        for seed in range(seeds) if seeds else [None]:
            extra = [] if seed is None else [f"run.seed={seed}"]
            name = slug(setting) + ("" if seed is None else f"-s{seed}")
            runs.append(SweepRun(name, setting, seed, [*base, *extra]))
    return runs


def label(setting: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "(base)"


# -- states -------------------------------------------------------------------------------------

def job_state(job_id: str) -> str | None:
    """SLURM's JobState of `job_id`, None when slurmctld does not know it (any more)."""
    done = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        return None
    m = re.search(r"JobState=(\S+)", done.stdout)
    return m.group(1) if m else None


def run_state(run_dir: Path, steps: int) -> dict:
    """{"state": done|running|queued|failed|interrupted|absent, "step", "job", "job_state"}."""
    out = {"step": None, "job": None, "job_state": None}
    if not run_dir.exists():
        return {**out, "state": "absent"}
    rows = read_metrics(run_dir)
    out["step"] = rows[-1].get("step") if rows else None
    job = read_json(run_dir / JOB_FILE).get("job_id")
    if job:
        out["job"], out["job_state"] = job, job_state(job)
    if finished(run_dir, steps):
        return {**out, "state": "done"}
    if out["job_state"] in LIVE_STATES:
        return {**out, "state": "running" if out["job_state"] == "RUNNING" else "queued"}
    if out["job_state"] is not None:
        return {**out, "state": "failed"}
    return {**out, "state": "interrupted"}


# -- the sweep ----------------------------------------------------------------------------------

def _args_of(config: str, overrides: list[str]) -> dict:
    return {"config": str(config), "overrides": list(overrides)}


def _prepare(run_dir: Path, args: dict, steps: int) -> str:
    """'done', 'live' (a job of this sweep is queued/running) or 'start' (folder ready)."""
    if run_dir.exists():
        if read_json(run_dir / ARGS_FILE) != args:
            raise BenchError(f"{run_dir} holds a run with other arguments (or none of this "
                             "sweep's): remove it, or choose another --out")
        state = run_state(run_dir, steps)["state"]
        if state == "done":
            print(reusing("sweep", run_dir), flush=True)
            return "done"
        if state in ("running", "queued"):
            print(f"sweep: {run_dir} is {state} (job {run_state(run_dir, steps)['job']})",
                  flush=True)
            return "live"
        print(f"sweep: {run_dir} is an interrupted run of this sweep: starting it again",
              flush=True)
        shutil.rmtree(run_dir)
    return "start"


def extends(old: dict, plan: dict) -> bool:
    """Whether `plan` is the sweep `old` planned, or it with more settings or seeds: every run
    of the old plan is in the new one as it was (name, overrides, steps), so its finished runs
    are reused and only the new ones are trained. The other way round, a sweep asked for a part
    of what its folder planned trains (or reuses) that part and keeps the larger plan."""
    runs = plan["runs"]
    return old.get("config") == plan["config"] and all(r in runs for r in old.get("runs", []))


def sweep(config: str, overrides: list[str], out: Path, seeds: int | None = None,
          slurm: dict | None = None, wait: bool = False, poll_s: float = 5.0,
          axis_keys: tuple[str, ...] = ()) -> dict | None:
    """Run (or queue) every run of the sweep; the summary when all have finished, else None.
    `axis_keys`: keys swept even when given one value (parse_overrides)."""
    from protocol.config import load_config

    axes, fixed = parse_overrides(overrides, axis_keys)
    runs = plan_runs(axes, fixed, seeds)
    steps = {}
    for r in runs:  # every config is checked before anything starts (keys a run leaves inert
        # are set back to their defaults by train_run, as in the benches)
        steps[r.name] = load_config(config, [*r.overrides, *RUN_FIXED],
                                    refuse_inert=False).run.steps
    model = shared_model(load_config(config, fixed)) if seeds else []
    plan = {"config": str(config), "axes": axes, "fixed": fixed, "seeds": seeds,
            "slurm": slurm, "runs": [{"name": r.name, "setting": r.setting, "seed": r.seed,
                                      "overrides": r.overrides, "steps": steps[r.name]}
                                     for r in runs]}
    out.mkdir(parents=True, exist_ok=True)
    old = read_json(out / PLAN_FILE)
    if old and not (extends(old, plan) or extends(plan, old)):
        raise BenchError(f"{out} holds another sweep ({old.get('config')}, "
                         f"{len(old.get('runs', []))} runs): choose another --out")
    if not old or extends(old, plan):  # a part of a larger sweep keeps the larger plan
        write_json_atomic(out / PLAN_FILE, plan)
    for r in runs:
        run_dir = out / "runs" / r.name
        run_overrides = [*model, *r.overrides]
        args = _args_of(config, run_overrides)
        if _prepare(run_dir, args, steps[r.name]) != "start":
            continue
        if slurm is None:
            from rlvr.bench.common import train_run

            train_run(config, out, r.name, run_overrides, tag="sweep")
        else:
            _submit(config, run_overrides, run_dir, args, slurm)
    if slurm is not None and wait:
        _wait(out, plan, poll_s)
    states = {r["name"]: run_state(out / "runs" / r["name"], r["steps"]) for r in plan["runs"]}
    if any(s["state"] != "done" for s in states.values()):
        print(status_text(out), flush=True)
        print(f"sweep: not every run has finished; `rlvr sweep --status --out {out}` shows them, "
              "the same command again makes the table when they have", flush=True)
        return None
    return summarize(out, plan)


def _submit(config: str, overrides: list[str], run_dir: Path, args: dict, slurm: dict) -> None:
    from slurm.submit import submit

    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / ARGS_FILE, args)
    job = submit(config, [*overrides, f"run.name={run_dir.name}", *RUN_FIXED], run_dir=run_dir,
                 job_name=f"sweep-{run_dir.name}"[:60], **slurm)
    write_json_atomic(run_dir / JOB_FILE, {"job_id": job})
    print(f"sweep: queued {run_dir.name} as job {job}", flush=True)


def _wait(out: Path, plan: dict, poll_s: float) -> None:
    while True:
        states = [run_state(out / "runs" / r["name"], r["steps"])["state"] for r in plan["runs"]]
        if not any(s in ("running", "queued") for s in states):
            return
        time.sleep(poll_s)


def summarize(out: Path, plan: dict) -> dict:
    """The sweep's table (a row per setting, means over seeds) and overlaid plots."""
    from rlvr.compare import overlay, run_summary, table

    by_setting: dict[str, list[dict]] = {}
    all_rows, labels = [], []
    for r in plan["runs"]:
        rows = read_metrics(out / "runs" / r["name"])
        key = label(r["setting"])
        by_setting.setdefault(key, []).append(run_summary(rows))
        all_rows.append(rows)
        labels.append(key + ("" if r["seed"] is None else f" s{r['seed']}"))
    settings = list(by_setting)
    means = [_mean_summary(by_setting[s]) for s in settings]
    text = table(settings, means, label_header="setting")
    pngs = overlay(all_rows, labels, out)
    (out / "sweep.md").write_text(text)
    results = {"settings": dict(zip(settings, means)), "plots": [str(p) for p in pngs],
               "runs": {r["name"]: str(out / "runs" / r["name"]) for r in plan["runs"]}}
    write_json_atomic(out / "sweep_results.json", results)
    print(text, flush=True)
    for p in pngs:
        print(p)
    return results


def _mean_summary(summaries: list[dict]) -> dict:
    out = {}
    for key in summaries[0]:
        vals = [s[key] for s in summaries if isinstance(s.get(key), (int, float))]
        if key in ("k", "steps", "stale_max"):
            out[key] = max(vals) if vals else None
        else:
            out[key] = sum(vals) / len(vals) if vals else None
    return out


def status_text(out: Path) -> str:
    plan = read_json(out / PLAN_FILE)
    if not plan:
        raise BenchError(f"{out}: no {PLAN_FILE} (not a sweep folder; --out names it)")
    lines = [f"sweep {out}: {plan['config']} {' '.join(plan['fixed'])}"]
    done = 0
    for r in plan["runs"]:
        s = run_state(out / "runs" / r["name"], r["steps"])
        done += s["state"] == "done"
        job = f", job {s['job']} {s['job_state'] or '(gone)'}" if s["job"] else ""
        step = "-" if s["step"] is None else s["step"]
        lines.append(f"  {s['state']:<11} {r['name']}: step {step}/{r['steps']}{job}")
    lines.append(f"{done}/{len(plan['runs'])} runs done")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------

def run(args) -> int:
    out = Path(args.out)
    try:
        if args.status:
            print(status_text(out))
            return 0
        if not args.config:
            raise BenchError("give a CONFIG and key=v1,v2 overrides (or --status)")
        slurm = None
        if args.slurm:
            if not args.nodes:
                raise BenchError("--slurm needs --nodes N (learner + actor nodes per run)")
            slurm = dict(nodes=args.nodes, actors_per_node=args.actors_per_node,
                         learner_nodes=args.learner_nodes,
                         learner_ranks_per_node=args.learner_ranks_per_node,
                         hetjob=args.hetjob, time=args.time, cpus_per_task=args.cpus_per_task,
                         extra_sbatch=list(args.sbatch))
        elif args.nodes or args.wait:
            raise BenchError("--nodes and --wait go with --slurm")
        if args.seeds is not None and args.seeds < 1:
            raise BenchError("--seeds must be >= 1")
        overrides = list(args.overrides) + ([f"run.steps={args.steps}"] if args.steps else [])
        sweep(args.config, overrides, out, args.seeds, slurm, args.wait, args.poll_s)
    except (BenchError, ValueError, RuntimeError) as e:  # ConfigError is a ValueError
        print(f"rlvr sweep: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    return 0


def add_cli(sub) -> None:
    s = sub.add_parser("sweep", help="runs over the product of config values, one table")
    s.add_argument("config", nargs="?", help="YAML config, e.g. configs/tiny-cpu.yaml")
    s.add_argument("overrides", nargs="*", help="key=v1,v2 (an axis) or a.b=value (every run)")
    s.add_argument("--seeds", type=int, help="run.seed 0..K-1 for every setting")
    s.add_argument("--steps", type=int, help="override run.steps")
    s.add_argument("--out", default="runs/sweep", help="sweep folder (default runs/sweep)")
    s.add_argument("--status", action="store_true", help="show which runs of --out are done")
    s.add_argument("--slurm", action="store_true", help="one SLURM job per run")
    s.add_argument("--nodes", type=int, help="--slurm: nodes per run (learner + actors)")
    s.add_argument("--actors-per-node", type=int, default=1)
    s.add_argument("--learner-nodes", type=int, default=1)
    s.add_argument("--learner-ranks-per-node", type=int, default=1)
    s.add_argument("--hetjob", action="store_true")
    s.add_argument("--time", default="1:00:00", help="--slurm: time limit per job")
    s.add_argument("--cpus-per-task", type=int, default=1)
    s.add_argument("--sbatch", action="append", default=[], metavar="OPT",
                   help="extra sbatch option for every job, e.g. --sbatch=--partition=gpu")
    s.add_argument("--wait", action="store_true", help="--slurm: wait for every job, then the table")
    s.add_argument("--poll-s", type=float, default=5.0, help="--wait: seconds between polls")
    s.set_defaults(func=run)
