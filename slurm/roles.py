"""Which process is this SLURM task? Derive a `Role` (learner rank r of R, or actor i of A, plus
the learner's address and the run's ports) from the environment SLURM gives every task.

Why: one job script starts every process of a run with `srun python -m slurm.role ...`; each task
must find out on its own what to be and where the learner is, with no file or daemon to agree
through. Everything here is a pure function of an env mapping and explicit numbers, except the two
`scontrol` calls at the bottom (`hostnames`, `node_addr`), which `role_from_slurm` wires in.

Layout: learner ranks on the first `learner_nodes` nodes (`learner_ranks_per_node` each), actors on
the other nodes (`actors_per_node` each). A task learns its group in one of three ways:
  * `group` given ("learner" / "actor"): the job runs one `srun` step per group (what
    `slurm/templates/job.sbatch` does). The index is SLURM_PROCID within that step.
  * heterogeneous job, one step over both components (`srun --het-group=0,1`): component 0 is the
    learner; Slurm numbers tasks across components, so SLURM_PROCID < SLURM_NTASKS_HET_GROUP_0
    is a learner rank.
  * homogeneous job, one step over all nodes (`srun --ntasks-per-node=K`): SLURM_NODEID and
    SLURM_LOCALID place the task; tasks beyond a node's quota are "idle" and exit at once.
What Slurm 22.05 sets (measured): in every step of a heterogeneous job SLURM_HET_SIZE and the
per-component SLURM_JOB_NODELIST_HET_GROUP_<k>, SLURM_NTASKS_HET_GROUP_<k>,
SLURM_JOB_NUM_NODES_HET_GROUP_<k>; SLURM_JOB_ID is the leader's id in both components. In a step
of a homogeneous job SLURM_JOB_NODELIST is the whole allocation while SLURM_NODEID counts from the
step's first node.

Counts come from the allocation, not from the step, so learner and actor steps agree on them:
R = ranks per node x learner nodes; A = actors per node x the other nodes (for a heterogeneous job,
SLURM_NTASKS_HET_GROUP_0 and _1). Ports come from the job id, so the tasks of one job agree and
two jobs sharing nodes (the emulated test cluster) do not collide; a requeued job keeps its id.

    role = role_from_slurm(os.environ, Layout(learner_nodes=1, actors_per_node=2), group="actor")
    argv, env = exec_plan(role, "runs/demo", overrides=[], python=[sys.executable])
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

from protocol.exit_codes import REQUEUE_EXIT_CODE  # noqa: F401 - the job scripts' contract

Kind = Literal["learner", "actor", "idle"]


PREEMPT_SIGNAL = "USR1"
"""The preemption notice the job script passes to the learner ranks (and only to them)."""

RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                  "LOCAL_WORLD_SIZE")
"""The torch.distributed env:// variables: set for learner ranks, removed for actors."""

BIND_ALL = "0.0.0.0"
"""Learner ranks bind their sockets on every interface: actors reach them from other nodes."""

PORT_RANGE = (20000, 32768)
"""Ports derived from the job id fall in this range, below Linux's ephemeral ports (32768-60999),
so an outgoing connection never holds one. Two jobs whose ids differ by a multiple of 3191 and
share a node would collide: pin ports with `--port-base` there."""

PORTS_PER_JOB = 4
"""Consecutive ports a job takes: master (DeepSpeed rendezvous), ZeroMQ, weight sync, one spare."""


class RoleError(ValueError):
    """The SLURM environment does not fit the requested layout; the message says what is off."""


@dataclass(frozen=True)
class Layout:
    learner_nodes: int = 1
    """Nodes at the start of the allocation (or in het component 0) that run learner ranks."""
    learner_ranks_per_node: int = 1
    """Data-parallel learner ranks per learner node (one per GPU on GPU nodes)."""
    actors_per_node: int = 1
    """Actor processes per actor node."""


@dataclass(frozen=True)
class Role:
    kind: Kind
    """learner, actor, or idle (a surplus task of a one-step homogeneous job)."""
    index: int
    """Learner rank (0..learner_ranks-1) or actor id (0..actors-1); -1 when idle."""
    local_rank: int
    """SLURM_LOCALID: the task's index on its node."""
    local_count: int
    """Tasks of this group on this node (LOCAL_WORLD_SIZE for learner ranks)."""
    learner_ranks: int
    """R: data-parallel learner ranks in the run."""
    actors: int
    """A: actors in the run."""
    learner_host: str
    """Address of the first learner node: MASTER_ADDR and where actors reach the learner."""
    master_port: int
    zmq_port: int
    weights_port: int
    job_id: int
    restart_count: int
    """SLURM_RESTART_COUNT: 0 on the first run, n after the n-th requeue."""


def _int(env: Mapping[str, str], key: str) -> int:
    if key not in env:
        raise RoleError(f"{key} is not set: run this inside a SLURM job step (srun)")
    try:
        return int(env[key])
    except ValueError:
        raise RoleError(f"{key}={env[key]!r} is not an integer") from None


def is_het(env: Mapping[str, str]) -> bool:
    """True inside a heterogeneous job (any of its steps)."""
    return "SLURM_HET_SIZE" in env or "SLURM_JOB_NODELIST_HET_GROUP_0" in env


def learner_nodelist(env: Mapping[str, str]) -> str:
    """The compressed nodelist whose first node is the first learner node."""
    key = "SLURM_JOB_NODELIST_HET_GROUP_0" if is_het(env) else "SLURM_JOB_NODELIST"
    if not env.get(key):
        raise RoleError(f"{key} is not set: run this inside a SLURM job step (srun)")
    return env[key]


def job_counts(env: Mapping[str, str], layout: Layout) -> tuple[int, int]:
    """(R learner ranks, A actors) of the whole run, from the allocation."""
    if is_het(env):
        return _int(env, "SLURM_NTASKS_HET_GROUP_0"), _int(env, "SLURM_NTASKS_HET_GROUP_1")
    nodes = _int(env, "SLURM_JOB_NUM_NODES")
    if nodes <= layout.learner_nodes:
        raise RoleError(f"the job has {nodes} node(s): it needs more than learner_nodes="
                        f"{layout.learner_nodes}, at least one node for actors")
    actor_nodes = nodes - layout.learner_nodes
    return (layout.learner_nodes * layout.learner_ranks_per_node,
            actor_nodes * layout.actors_per_node)


def task_place(env: Mapping[str, str], layout: Layout,
               group: Kind | None) -> tuple[Kind, int, int]:
    """(kind, index, tasks of that kind on this node) of this task; see the module docstring."""
    procid, local = _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID")
    learner_per_node, actor_per_node = layout.learner_ranks_per_node, layout.actors_per_node
    if group is not None:  # one step per group: the step is the group
        return group, procid, learner_per_node if group == "learner" else actor_per_node
    if is_het(env):  # one step over both components: component 0 first
        learners = _int(env, "SLURM_NTASKS_HET_GROUP_0")
        if procid < learners:
            return "learner", procid, learner_per_node
        return "actor", procid - learners, actor_per_node
    node = _int(env, "SLURM_NODEID")  # one step over all nodes of a homogeneous job
    if node < layout.learner_nodes:
        if local < learner_per_node:
            return "learner", node * learner_per_node + local, learner_per_node
        return "idle", -1, 0
    if local < actor_per_node:
        return "actor", (node - layout.learner_nodes) * actor_per_node + local, actor_per_node
    return "idle", -1, 0


def job_ports(job_id: int, port_base: int | None = None) -> tuple[int, int, int]:
    """(master, zmq, weights) ports: `port_base` and the next two, or derived from the job id."""
    if port_base is None:
        lo, hi = PORT_RANGE
        port_base = lo + (job_id * PORTS_PER_JOB) % (hi - lo - PORTS_PER_JOB)
    return port_base, port_base + 1, port_base + 2


def derive_role(env: Mapping[str, str], layout: Layout, learner_host: str,
                group: Kind | None = None, port_base: int | None = None) -> Role:
    """The role of the task whose SLURM environment is `env`; `learner_host` is the address of
    the first node of `learner_nodelist(env)`."""
    if group not in (None, "learner", "actor"):
        raise RoleError(f"group must be 'learner' or 'actor', got {group!r}")
    kind, index, per_node = task_place(env, layout, group)
    learner_ranks, actors = job_counts(env, layout)
    count = learner_ranks if kind == "learner" else actors
    if kind != "idle" and index >= count:
        raise RoleError(f"{kind} index {index} is outside 0..{count - 1}: the srun step has more "
                        f"tasks than the layout {layout} gives the allocation")
    job_id = _int(env, "SLURM_JOB_ID")
    master, zmq, weights = job_ports(job_id, port_base)
    return Role(kind=kind, index=index, local_rank=_int(env, "SLURM_LOCALID"),
                local_count=per_node, learner_ranks=learner_ranks, actors=actors,
                learner_host=learner_host, master_port=master, zmq_port=zmq,
                weights_port=weights, job_id=job_id,
                restart_count=int(env.get("SLURM_RESTART_COUNT") or 0))


ENTRY_MODULES = {"learner": "learner.main", "actor": "actors.main"}


def role_overrides(role: Role) -> list[str]:
    """Dotted overrides that point a process at this job's learner and give it the run's shape
    (every config key the launcher sets is named here)."""
    values = {"net.learner_host": role.learner_host, "net.master_port": role.master_port,
              "net.zmq_port": role.zmq_port, "net.weights_port": role.weights_port,
              "actors.count": role.actors, "learner.ranks": role.learner_ranks}
    if role.kind == "learner":
        values["net.bind_host"] = BIND_ALL
    return [f"{key}={value}" for key, value in values.items()]


def exec_plan(role: Role, run_dir: str, overrides: Sequence[str] = (),
              python: Sequence[str] = ("python",)) -> tuple[list[str], dict[str, str]]:
    """(argv, env additions) that start `role`'s entry point. The user's `overrides` come first so
    the launcher's (addresses, ports, counts: facts of this allocation) win. A learner of a
    requeued job (SLURM_RESTART_COUNT > 0) gets `--resume`."""
    if role.kind == "idle":
        raise RoleError("an idle task has no entry point")
    argv = [*python, "-m", ENTRY_MODULES[role.kind], "--run-dir", str(run_dir)]
    if role.kind == "actor":
        argv += ["--actor-id", str(role.index)]
    if role.kind == "learner" and role.restart_count > 0:  # requeued: carry on from the checkpoint
        argv += ["--resume"]
    argv += [*overrides, *role_overrides(role)]
    env: dict[str, str] = {}
    if role.kind == "learner":  # torch.distributed / DeepSpeed env:// rendezvous
        env = dict(zip(RENDEZVOUS_ENV, (role.learner_host, str(role.master_port), str(role.index),
                                        str(role.learner_ranks), str(role.local_rank),
                                        str(role.local_count))))
    return argv, env


# --- the only calls out of this module: two scontrol queries -------------------------------------

def parse_node_addr(scontrol_node_line: str) -> str:
    """NodeAddr from one line of `scontrol show node -o NAME`."""
    for field in scontrol_node_line.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    raise RoleError(f"no NodeAddr in scontrol output: {scontrol_node_line[:200]!r}")


def hostnames(nodelist: str) -> list[str]:
    """Expand a compressed nodelist (`c[1-3]`) with `scontrol show hostnames`."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def node_addr(name: str) -> str:
    """The address SLURM itself uses for node `name` (NodeAddr). Right on real clusters, and the
    only right answer on an emulated one, where node names do not resolve."""
    out = subprocess.run(["scontrol", "show", "node", "-o", name], check=True,
                         capture_output=True, text=True).stdout
    return parse_node_addr(out)


def role_from_slurm(env: Mapping[str, str], layout: Layout, group: Kind | None = None,
                    port_base: int | None = None) -> Role:
    """`derive_role` with the learner's address looked up through scontrol."""
    first = hostnames(learner_nodelist(env))[0]
    return derive_role(env, layout, node_addr(first), group, port_base)
