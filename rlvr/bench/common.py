"""What every `rlvr bench` shares: run a training run as a user does, write results, print.

Training runs go through the launcher `rlvr train` uses (`rlvr.launch.train`: learner and
actor processes on this machine), one at a time, into `<out>/runs/<name>/`, with wandb off and
no progress line. Beside each run the bench writes `bench_args.json` (the config path and
overrides it ran with). Running the bench again reuses a finished run whose arguments are the
same and starts an unfinished one with the same arguments again (it was this bench's, cut off),
so an interrupted benchmark continues where it stopped. A run folder with other arguments, or
without that file, stops the bench with a message naming it: nothing else is ever removed.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from pathlib import Path

from learner.progress import is_scalar
from learner.run_log import SUMMARY_FILE, read_metrics, write_json_atomic

ARGS_FILE = "bench_args.json"
LAUNCH_FILE = "bench_launch.json"
# a bench run needs only its final checkpoint (one kept) and no dashboard; a user's own
# overrides come after these and win
RUN_DEFAULTS = ["run.checkpoint_every=0", "run.keep_checkpoints=1"]
RUN_FIXED = ["run.wandb=disabled", "run.progress=false"]


class BenchError(RuntimeError):
    """A benchmark cannot go on (a run failed, a run folder is in the way)."""


def names(text: str) -> tuple[str, ...]:
    """A comma-separated command-line list, blanks dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def with_steps(overrides: list[str], steps: int | None) -> list[str]:
    return [*overrides, f"run.steps={steps}"] if steps else overrides


def run_overrides(user: list[str], steps: int | None, variant: list[str]) -> list[str]:
    """Overrides for one run, later ones winning: bench defaults < the user's < --steps < the
    variant's own (algorithm, seed, mode)."""
    return [*RUN_DEFAULTS, *user, *([f"run.steps={steps}"] if steps else []), *variant]


def shared_model(cfg) -> list[str]:
    """`model.path=...` of the config's warm-started tiny model, built once (with the config's
    own seed) so every run of a bench starts from the same weights, whatever its run.seed; []
    when the config names its model."""
    if cfg.model.path:
        return []
    from rlvr.warm_start import ensure_warm_start

    return [f"model.path={ensure_warm_start(cfg, lambda line: print(line, flush=True))}"]


def train_run(config: str, out_dir: Path, name: str, overrides: list[str],
              tag: str = "bench") -> tuple[Path, dict]:
    """Train (or reuse) run `name` under `out_dir/runs/`; returns its folder and how the launch
    went: seconds (process start-up and any warm start included) and the machine's 1-minute
    load average before and after (another workload on the cores skews every timing); a reused
    run's are those of its launch, with "reused": True. `tag` starts its messages (the
    benches', `rlvr sweep`'s)."""
    from rlvr.launch import train
    from protocol.config import load_config
    from protocol.config.inert import neutral_overrides

    # one YAML under several modes or algorithms: keys a variant leaves inert (max_staleness
    # in mode sync, rollout.group_size under ar3po, ...) go back to their defaults, which
    # changes nothing the run does and keeps the refusal for a user's own run
    inert = neutral_overrides(load_config(config, overrides, refuse_inert=False))
    if inert:
        print(f"{tag}: {name}: inert here, set to defaults: {' '.join(inert)}", flush=True)
    overrides = [*overrides, *inert]
    runs = out_dir / "runs"
    run_dir = runs / name
    args = {"config": str(config), "overrides": list(overrides)}
    steps = load_config(config, overrides).run.steps  # refused here if not neutral
    if run_dir.exists():
        if not _same_args(run_dir, args):
            raise BenchError(f"{run_dir} holds a run with other arguments (or none of this "
                             f"{tag}'s): remove it, or choose another --out")
        if finished(run_dir, steps):
            print(reusing(tag, run_dir), flush=True)
            return run_dir, {"reused": True, **read_json(run_dir / LAUNCH_FILE)}
        print(f"{tag}: {run_dir} is an interrupted run of this {tag}: starting it again",
              flush=True)
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / ARGS_FILE, args)
    print(f"{tag}: training {name} ({' '.join(overrides)})", flush=True)
    t0, load_before = time.time(), _load_avg()
    code = train(str(config), [*overrides, f"run.out_dir={runs}", f"run.name={name}", *RUN_FIXED],
                 None, False)
    launch = {"seconds": time.time() - t0, "load_avg_1m_before": load_before,
              "load_avg_1m_after": _load_avg()}
    if code != 0:
        raise BenchError(f"run {name} exited with code {code}; see {run_dir}/logs/")
    write_json_atomic(run_dir / LAUNCH_FILE, launch)  # kept for the results of a later reuse
    return run_dir, launch


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _same_args(run_dir: Path, args: dict) -> bool:
    return read_json(run_dir / ARGS_FILE) == args


def reusing(tag: str, run_dir: Path) -> str:
    """The line said when a finished run is reused: with the code that made it where that is
    not this checkout's clean commit, since its numbers may not be what today's code makes."""
    from learner.code_version import code_version, differs

    why = differs(read_json(run_dir / SUMMARY_FILE).get("code"), code_version())
    return f"{tag}: reusing finished run {run_dir}" + (f" ({why})" if why else "")


def finished(run_dir: Path, steps: int) -> bool:
    rows = read_metrics(run_dir)
    return (run_dir / SUMMARY_FILE).exists() and bool(rows) and rows[-1].get("step") == steps


def machine() -> dict:
    """Where the numbers came from."""
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        info["cpu_model"] = next(line.split(":", 1)[1].strip()
                                 for line in Path("/proc/cpuinfo").read_text().splitlines()
                                 if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu_model"] = platform.processor() or None
    info["load_avg_1m_at_end"] = _load_avg()  # another process's load skews timings
    return info


def write_results(out_dir: Path, results: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    write_json_atomic(path, _finite(results))
    return path


def _finite(value):
    """JSON has no NaN/inf: they become null (a missing number, as everywhere in the bench)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if is_scalar(value):
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return str(value)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |"
              for row in rows]
    return "\n".join(lines) + "\n"


def targets_table(targets: dict) -> str:
    def num(v) -> str:
        return "-" if v is None else f"{v:.4g}"

    rows = [[name, fmt(t["met"]), num(t["value"]), f"{t['op']} {num(t['threshold'])}"]
            for name, t in targets.items()]
    return markdown_table(["target", "met", "value", "needs"], rows)
