"""A real single-machine SLURM cluster for tests: the `slurm_cluster` session fixture.

It runs `slurm/cluster/up.sh` (Debian's slurmctld + slurmd + munge, Slurm 22.05) with 3 emulated
nodes c1..c3 (NodeAddr 127.0.0.1..3, all on this machine) under a pytest tmp dir, and stops the
daemons by PID with `slurm/cluster/down.sh` at the end. When the machine cannot run one (not root,
or apt cannot install the packages) it fails under CI (RLVR_CI=1, set by .ci/run) and elsewhere
skips, saying why (listed by `-rs`); any other start failure fails.

    from tests.slurm_cluster import slurm_cluster_fixture  # noqa: F401  (the fixture)

    def test_x(slurm_cluster):
        state, exit_code = slurm_cluster.wait_job(job_id, timeout_s=60)

Also here: PROBE, a stand-in for the learner and actor entry points. `slurm.role` execs it (via
RLVR_SLURM_EXEC) in place of `python -m learner.main ...`; it writes what it was given (argv,
overrides, SLURM and rendezvous env) to RUN_DIR/probe/<kind>-<index>-r<restart>.json.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UP, DOWN = ROOT / "slurm" / "cluster" / "up.sh", ROOT / "slurm" / "cluster" / "down.sh"
NODES = 3
CPUS_PER_NODE = 8  # emulated: 3 nodes x 8 "CPUs" on a 2-core machine, enough for a few tasks each
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}

PROBE = r'''
"""Stand-in entry point: record what this task was told; optionally act out a preemption."""
import json, os, signal, sys, time
from pathlib import Path

args = sys.argv[1:]  # -m learner.main --run-dir D [--actor-id I] [--resume] a.b=v ...
kind = {"learner.main": "learner", "actors.main": "actor"}[args[1]]
run_dir = Path(args[args.index("--run-dir") + 1])
index = int(os.environ["RANK"]) if kind == "learner" else int(args[args.index("--actor-id") + 1])
restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
out = run_dir / "probe"
out.mkdir(exist_ok=True)
mode = os.environ.get("PROBE_MODE", "").split(",")


def mark(name, text=""):
    (out / f"{kind}-{index}-r{restart}-{name}").write_text(text)


keys = ("SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
record = {"kind": kind, "index": index, "restart": restart, "argv": args,
          "overrides": dict(a.split("=", 1) for a in args[2:] if "=" in a[1:]),
          "env": {k: os.environ.get(k) for k in keys}}
tmp = out / f".{kind}-{index}-r{restart}.json"
tmp.write_text(json.dumps(record))
tmp.rename(out / f"{kind}-{index}-r{restart}.json")

signal.signal(signal.SIGUSR1, lambda *_: mark("usr1", str(time.time())))
if kind == "learner":  # like a real learner, wait for the actors (the job stops them after us)
    deadline, actors = time.time() + 60, int(record["overrides"]["actors.count"])
    while len(list(out.glob(f"actor-*-r{restart}.json"))) < actors and time.time() < deadline:
        time.sleep(0.05)
if kind == "learner" and "requeue" in mode and restart == 0:
    mark("ready")  # the test sends the preemption notice only after this
    deadline = time.time() + 60
    while not (out / f"{kind}-{index}-r0-usr1").exists() and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(3 if (out / f"{kind}-{index}-r0-usr1").exists() else 1)  # 3 = REQUEUE_EXIT_CODE
if kind == "actor" and "actors-linger" in mode:  # run until the job script stops the actors
    signal.signal(signal.SIGTERM, lambda *_: (mark("term"), sys.exit(0)))
    time.sleep(120)
    sys.exit(1)
'''


@dataclass
class SlurmCluster:
    dir: Path
    """SLURM_CI_DIR: PID files, daemon logs (log/), state."""
    nodes: list[str]
    node_addrs: dict[str, str]

    def job_lines(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job -o` as dicts (one per het component); [] if unknown."""
        done = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return []
        return [dict(f.split("=", 1) for f in line.split() if "=" in f)
                for line in done.stdout.splitlines() if line.strip()]

    def wait_for(self, what: str, predicate, timeout_s: float, job_id: str | None = None,
                 poll_s: float = 0.1):
        """Poll `predicate()` until it returns something truthy; fail with context on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(poll_s)
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n" + self.context(job_id))

    def wait_job(self, job_id: str, timeout_s: float = 60) -> tuple[str, str]:
        """Poll until every component of the job is in a final state; (state, ExitCode)."""
        def done():
            lines = self.job_lines(job_id)
            if lines and all(j.get("JobState") in FINAL_STATES for j in lines):
                return lines[0]["JobState"], lines[0].get("ExitCode", "?")
            return None
        return self.wait_for(f"job {job_id} to finish", done, timeout_s, job_id)

    def processes(self, needle: str) -> list[str]:
        """Live (not zombie) processes whose command line contains `needle`."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                zombie = ") Z " in (proc / "stat").read_text()
            except OSError:
                continue
            if needle in cmd and not zombie and proc.name != str(os.getpid()):
                found.append(f"{proc.name} {cmd.strip()}")
        return found

    def wait_no_processes(self, job_id: str, *needles: str, timeout_s: float = 10) -> None:
        """Every process of a finished job is gone: its batch script and any naming `needles`."""
        needles = (f"job{int(job_id):05d}/slurm_script", *needles)
        self.wait_for(f"job {job_id}'s processes to exit",
                      lambda: not any(self.processes(n) for n in needles), timeout_s, job_id)

    def hurry(self, job_id: str, delay_s: int = 2) -> None:
        """Let a requeued job start in `delay_s` instead of the ~2 min Slurm holds it (BeginTime).
        Not at once: slurmd refuses a credential issued in the same second as the revocation of
        the first run's ("Job credential revoked") and the job would fail."""
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{delay_s}"],
                       check=True)

    def preempt_and_requeue(self, job_id: str, requeue_timeout_s: float) -> None:
        """Send the batch shell USR1 (what --signal=B:USR1@N does before the time limit), wait
        until the job is back in the queue after its first run, and let it start again soon."""
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)

        def requeued():
            lines = self.job_lines(job_id)
            return lines and lines[0].get("Restarts") == "1" and lines[0]["JobState"] == "PENDING"
        self.wait_for("the job to be requeued", requeued, requeue_timeout_s, job_id)
        self.hurry(job_id)

    def context(self, job_id: str | None) -> str:
        """What to read when a job misbehaves: scontrol's view, its output, slurmctld's log."""
        parts = []
        if job_id is not None:
            lines = self.job_lines(job_id)
            parts.append(f"scontrol: {lines}")
            for job in lines[:1]:
                out = job.get("StdOut", "")
                if out and Path(out).exists():
                    parts.append(f"--- {out}\n{Path(out).read_text()[-4000:]}")
        log = self.dir / "log" / "slurmctld.log"
        if log.exists():
            parts.append("--- slurmctld.log\n" + "\n".join(log.read_text().splitlines()[-30:]))
        return "\n".join(parts)

    def write_probe(self, where: Path) -> str:
        """Write PROBE to `where` and return the RLVR_SLURM_EXEC value that runs it."""
        path = where / "probe.py"
        path.write_text(PROBE)
        return f"{sys.executable} {path}"


def _node_addrs(names: list[str]) -> dict[str, str]:
    from slurm.roles import node_addr
    return {n: node_addr(n) for n in names}


def cannot_run(reason: str) -> None:
    """A real component cannot start on this machine: CI fails (it must run everything), a
    developer's run skips with the reason."""
    if os.environ.get("RLVR_CI") == "1":
        pytest.fail(f"{reason} (RLVR_CI=1: CI runs every real component)")
    pytest.skip(reason)


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture(tmp_path_factory):
    """The running cluster (a SlurmCluster); daemons stopped by PID when the session ends."""
    if os.geteuid() != 0:
        cannot_run("SLURM tests need root (they start slurmctld, slurmd and munged)")
    ci_dir = tmp_path_factory.mktemp("slurmci")
    env = {**os.environ, "SLURM_CI_DIR": str(ci_dir), "SLURM_CI_NODES": str(NODES),
           "SLURM_CI_CPUS": str(CPUS_PER_NODE)}
    t0 = time.monotonic()
    up = subprocess.run(["bash", str(UP)], env=env, capture_output=True, text=True, timeout=900)
    if up.returncode == 2:  # up.sh: cannot run here (not root / packages not installable)
        reason = up.stderr.strip().splitlines()
        print(f"slurm_cluster: skipped: {up.stderr.strip()}", file=sys.stderr)
        cannot_run(f"no SLURM cluster: {reason[0] if reason else 'up.sh exit 2'}")
    try:
        if up.returncode != 0:
            pytest.fail(f"slurm/cluster/up.sh failed ({up.returncode}):\n"
                        f"{up.stdout}\n{up.stderr}")
        names = [f"c{i}" for i in range(1, NODES + 1)]
        cluster = SlurmCluster(dir=ci_dir, nodes=names, node_addrs=_node_addrs(names))
        print(f"slurm_cluster: up in {time.monotonic() - t0:.1f} s at {ci_dir}", file=sys.stderr)
        yield cluster
    finally:
        down = subprocess.run(["bash", str(DOWN)], env=env, capture_output=True, text=True,
                              timeout=120)
        if down.returncode != 0:
            print(f"slurm/cluster/down.sh: {down.stderr}", file=sys.stderr)
