"""Per-task entry of a SLURM job: work out this task's role and exec its entry point.

    srun python -m slurm.role --run-dir RUN_DIR --group learner --learner-nodes 1 [a.b=value ...]

Run by `srun` inside the job script that `slurm/render.py` writes (one step per group, `--group`
given), or by hand in one step over a whole allocation (no `--group`: the layout places each task;
see `slurm/roles.py`). A learner rank becomes
    python -m learner.main --run-dir RUN_DIR [a.b=value ...] net.learner_host=ADDR ...
with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE set (and `--resume`
after a requeue); actor i becomes
    python -m actors.main --run-dir RUN_DIR --actor-id I [a.b=value ...] net.learner_host=ADDR ...
The process is replaced (os.execv), so srun's signals (USR1 preemption notice, TERM) and the exit
code (REQUEUE_EXIT_CODE asks the job script to requeue) go straight to and from the entry point.

RLVR_SLURM_EXEC (env) replaces the interpreter, e.g. "python /tmp/probe.py": the probe then gets
`-m learner.main --run-dir ...` as its arguments. Tests use it to record what each task was told.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys

from slurm.roles import RENDEZVOUS_ENV, Layout, RoleError, exec_plan, role_from_slurm

EXEC_ENV = "RLVR_SLURM_EXEC"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m slurm.role", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", required=True, help="run folder holding config.yaml")
    p.add_argument("--group", choices=["learner", "actor"], default=None,
                   help="this srun step runs only this group (default: place by layout)")
    p.add_argument("--learner-nodes", type=int, default=1)
    p.add_argument("--learner-ranks-per-node", type=int, default=1)
    p.add_argument("--actors-per-node", type=int, default=1)
    p.add_argument("--port-base", type=int, default=None,
                   help="master/zmq/weights ports: BASE, BASE+1, BASE+2 (default: by job id)")
    p.add_argument("overrides", nargs="*", metavar="a.b=value", help="config overrides passed on")
    return p.parse_args(argv)


def interpreter() -> list[str]:
    """The command that runs `-m module ...`: this Python, or $RLVR_SLURM_EXEC."""
    cmd = shlex.split(os.environ.get(EXEC_ENV, "")) or [sys.executable]
    cmd[0] = shutil.which(cmd[0]) or cmd[0]
    return cmd


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    layout = Layout(args.learner_nodes, args.learner_ranks_per_node, args.actors_per_node)
    try:
        role = role_from_slurm(os.environ, layout, args.group, args.port_base)
    except (RoleError, subprocess.CalledProcessError, FileNotFoundError) as e:
        print(f"slurm.role: {e}", file=sys.stderr)
        return 2
    if role.kind == "idle":  # a surplus task of a one-step job: nothing to run here
        return 0
    exec_argv, env = exec_plan(role, args.run_dir, args.overrides, interpreter())
    for key in RENDEZVOUS_ENV:  # only what exec_plan sets: nothing inherited from the submitter
        os.environ.pop(key, None)
    os.environ.update(env)
    sys.stdout.flush()
    os.execv(exec_argv[0], exec_argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
