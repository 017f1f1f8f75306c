"""How `make test` spreads the suite over its two xdist workers: a lane is a unit of work that one
worker runs whole, one test after another.

The files that keep both cores busy (training runs, benches) form one lane, so that two of them
never share the cores; the SLURM files form one lane because they share one cluster (a session
fixture per worker, on fixed ports: two at once would collide); the sandbox tests and the code
task's training run form one lane (the first check machine-wide that no sandbox process is left,
the second starts them all the time); every other file is a lane of
its own (its module fixtures, a vLLM engine, start once) and goes to whichever worker is free,
using the core the busy lane leaves idle. Measured on the whole suite run one test after
another: 1.55 of 2 cores busy, 465 core-seconds idle.

Why a scheduler of our own (`pytest_xdist_make_scheduler`, registered by tests/conftest.py)
rather than xdist's `--dist loadgroup` with `xdist_group` marks: xdist 3.8 names a group by
appending it to `item._nodeid`, which pytest 9.2 no longer reads (a node's id lives in `_id`),
so every test became a group of its own and the SLURM files ran on both workers at once.
tests/test_ci.py runs a small suite through this scheduler and checks where each test ran.
"""

from __future__ import annotations

BUSY_LANE = {"test_algorithms_e2e.py", "test_bench.py", "test_bench_generation.py",
             "test_e2e.py", "test_e2e_learner.py", "test_faults.py", "test_faults_wire.py",
             "test_learner_ranks.py", "test_sweep.py", "test_calibration.py",
             "test_deterministic.py", "test_lora.py"}
SLURM_LANE = {"test_slurm_cluster.py", "test_sweep_slurm.py"}
# the sandbox tests check machine-wide that no sandbox process outlives its run; the code task's
# training run starts sandboxes all the time
SANDBOX_LANE = {"test_sandbox.py", "test_sandbox_limits.py", "test_code_e2e.py"}
# The lanes that take longest start first, in this order, so that the suite ends on short files
# on both workers: xdist orders lanes by their number of tests, and test_gpu_check.py, one test
# of three to four minutes, ran last on one worker while the other had nothing left.
LONGEST_FIRST = ("busy", "test_gpu_check.py", "sandbox", "test_every_key.py")


def lane(nodeid: str) -> str:
    """The lane of a test, from its node id ("tests/test_e2e.py::test_x[a]" -> "busy")."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    for lane_name, files in (("busy", BUSY_LANE), ("slurm", SLURM_LANE),
                             ("sandbox", SANDBOX_LANE)):
        if name in files:
            return lane_name
    return path


def make_scheduler(config, log):
    """xdist's scope scheduling (a scope goes whole to one worker) with lanes as the scopes, for
    the load-balancing modes (`-n 2` alone means `--dist load`); None leaves `--dist each`,
    `worksteal` and `loadfile` to xdist."""
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") not in ("load", "loadscope", "loadgroup"):
        return None

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid)

        def _assign_work_unit(self, node) -> None:
            for first in reversed(LONGEST_FIRST):  # to the front of what is left
                for scope in [s for s in self.workqueue if s.rsplit("/", 1)[-1] == first]:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LaneScheduling(config, log)
