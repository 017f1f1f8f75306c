"""Render the sbatch script of a run from `slurm/templates/job.sbatch` (a `string.Template`).

Two shapes, one template; the learner and the actors are always two `srun` steps, so the job
script sees the learner's own exit code (REQUEUE_EXIT_CODE asks for a requeue) and can pass the
preemption signal to the learner alone:
  * homogeneous (default): `--nodes=N --ntasks-per-node=max(R/node, A/node)`; the learner step
    is `--relative=0` over the first `learner_nodes` nodes, the actor step `--relative=L` over
    the rest. Every node gets the same resource request (`extra_sbatch`).
  * heterogeneous (`hetjob=True`): component 0 = learner nodes, component 1 = actor nodes, each
    with its own resource request (`learner_sbatch`, `actor_sbatch`, e.g. different GPU counts or
    partitions); the steps are `srun --het-group=0` and `srun --het-group=1`.
Signal: `--signal=B:USR1@signal_s` goes to the batch shell only (without `B:` SLURM would signal
every task, and the actors, which do not handle USR1, would die first); the script forwards it to
the learner step. `--requeue` and `--open-mode=append` keep one job id and one log across restarts.

    script = render(JobSpec(run_dir="/abs/runs/demo", nodes=3, actors_per_node=2))

In the template `${name}` is filled in here and `$$` is a literal `$` for the shell.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template

from slurm.roles import PREEMPT_SIGNAL, REQUEUE_EXIT_CODE

TEMPLATE = Path(__file__).parent / "templates" / "job.sbatch"


@dataclass(frozen=True)
class JobSpec:
    run_dir: str
    """Absolute run folder: config.yaml is read from it, the job log slurm-<id>.out goes in it."""
    nodes: int
    """Total nodes: learner nodes plus actor nodes."""
    learner_nodes: int = 1
    """Nodes for learner ranks (the first ones, or het component 0)."""
    learner_ranks_per_node: int = 1
    """Data-parallel learner ranks per learner node."""
    actors_per_node: int = 1
    """Actors per actor node."""
    hetjob: bool = False
    """Heterogeneous job: separate resource requests for learner and actor nodes."""
    time: str = "1:00:00"
    """Time limit (sbatch --time)."""
    signal_s: int = 300
    """Seconds before the time limit that the learner gets the preemption notice."""
    actor_stop_grace_s: int = 30
    """After the learner step ends the actors get SIGTERM, and SIGKILL this much later."""
    cpus_per_task: int = 1
    """CPUs per task (sbatch and srun --cpus-per-task)."""
    job_name: str = "rlvr"
    python: str = sys.executable
    """Interpreter on the compute nodes (a shared filesystem is assumed)."""
    overrides: tuple[str, ...] = ()
    """a.b=value overrides every process gets on its command line."""
    extra_sbatch: tuple[str, ...] = ()
    """sbatch options for every node (every het component), e.g. "--partition=gpu"."""
    learner_sbatch: tuple[str, ...] = ()
    """sbatch options for the learner component only (hetjob)."""
    actor_sbatch: tuple[str, ...] = ()
    """sbatch options for the actor component only (hetjob)."""

    @property
    def actor_nodes(self) -> int:
        return self.nodes - self.learner_nodes

    @property
    def learner_ranks(self) -> int:
        return self.learner_nodes * self.learner_ranks_per_node

    @property
    def actors(self) -> int:
        return self.actor_nodes * self.actors_per_node

    def validate(self) -> None:
        for name in ("nodes", "learner_nodes", "learner_ranks_per_node", "actors_per_node",
                     "signal_s", "cpus_per_task", "actor_stop_grace_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.actor_nodes < 1:
            raise ValueError(f"nodes={self.nodes} leaves no node for actors after "
                             f"learner_nodes={self.learner_nodes}")
        if self.signal_s >= time_limit_s(self.time):  # SLURM would signal at once
            raise ValueError(f"signal_s={self.signal_s} must be shorter than the time limit "
                             f"{self.time} ({time_limit_s(self.time):.0f} s)")
        if not Path(self.run_dir).is_absolute():
            raise ValueError(f"run_dir must be absolute (tasks start elsewhere): {self.run_dir}")
        if (self.learner_sbatch or self.actor_sbatch) and not self.hetjob:
            raise ValueError("learner_sbatch/actor_sbatch need hetjob=True: a homogeneous job "
                             "asks the same of every node (use extra_sbatch)")
        for opt in (*self.extra_sbatch, *self.learner_sbatch, *self.actor_sbatch):
            if "\n" in opt or not opt.startswith("-"):
                raise ValueError(f"an sbatch option is one line starting with '-': {opt!r}")


def time_limit_s(limit: str) -> float:
    """Seconds in an sbatch --time value: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED."""
    if limit.upper() in ("UNLIMITED", "INFINITE"):
        return float("inf")
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", limit)
    if not match:
        raise ValueError(f"time {limit!r} is not a SLURM time limit (e.g. 90, 1:30:00, 2-00)")
    days, *fields = match.groups()
    given = [int(f) for f in fields if f is not None]
    if days is not None:  # D-H[:M[:S]]
        h, m, sec = given + [0] * (3 - len(given))
    else:  # M | M:S | H:M:S
        h, m, sec = {1: (0, given[0], 0), 2: (0, *given), 3: tuple(given)}[len(given)]
    return float((((int(days or 0) * 24 + h) * 60 + m) * 60) + sec)


def _directives(*options: str) -> list[str]:
    return [f"#SBATCH {o}" for o in options]


def resources(spec: JobSpec) -> str:
    """The #SBATCH lines that size the job (after the job-wide ones)."""
    common = (f"--time={spec.time}", f"--cpus-per-task={spec.cpus_per_task}", *spec.extra_sbatch)
    if not spec.hetjob:
        per_node = max(spec.learner_ranks_per_node, spec.actors_per_node)
        lines = _directives(f"--nodes={spec.nodes}", f"--ntasks-per-node={per_node}", *common)
        return "\n".join(lines)
    learner = _directives(f"--nodes={spec.learner_nodes}",
                          f"--ntasks-per-node={spec.learner_ranks_per_node}", *common,
                          *spec.learner_sbatch)
    actors = _directives(f"--nodes={spec.actor_nodes}",
                         f"--ntasks-per-node={spec.actors_per_node}", *common, *spec.actor_sbatch)
    return "\n".join([*learner, "#SBATCH hetjob", *actors])


def step_options(spec: JobSpec) -> tuple[str, str]:
    """srun options of the learner step and of the actor step."""
    cpus = f"--cpus-per-task={spec.cpus_per_task}"
    # an actor that dies must not take the step's other actors with it (a site's KillOnBadExit
    # would): the learner hands its prompts to the others and the run goes on
    survive = "--kill-on-bad-exit=0"
    if spec.hetjob:
        return f"--het-group=0 {cpus}", f"--het-group=1 {cpus} {survive}"
    learner = (f"--nodes={spec.learner_nodes} --ntasks={spec.learner_ranks} "
               f"--ntasks-per-node={spec.learner_ranks_per_node} --relative=0 {cpus}")
    actors = (f"--nodes={spec.actor_nodes} --ntasks={spec.actors} "
              f"--ntasks-per-node={spec.actors_per_node} --relative={spec.learner_nodes} {cpus} "
              f"{survive}")
    return learner, actors


def role_command(spec: JobSpec, group: str) -> str:
    """The shell command each task of `group`'s step runs."""
    argv = [spec.python, "-m", "slurm.role", "--group", group, "--run-dir", spec.run_dir,
            "--learner-nodes", str(spec.learner_nodes),
            "--learner-ranks-per-node", str(spec.learner_ranks_per_node),
            "--actors-per-node", str(spec.actors_per_node), *spec.overrides]
    return shlex.join(argv)


def render(spec: JobSpec) -> str:
    """The complete sbatch script for `spec`."""
    spec.validate()
    learner_step, actor_step = step_options(spec)
    return Template(TEMPLATE.read_text()).substitute(
        run_dir=spec.run_dir, job_name=spec.job_name, signal=PREEMPT_SIGNAL,
        signal_s=spec.signal_s, requeue_exit_code=REQUEUE_EXIT_CODE,
        actor_stop_grace_s=spec.actor_stop_grace_s,
        output=str(Path(spec.run_dir) / "slurm-%j.out"), resources=resources(spec),
        learner_step=learner_step, actor_step=actor_step,
        learner_cmd=role_command(spec, "learner"), actor_cmd=role_command(spec, "actor"))
