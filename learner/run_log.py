"""The run's metrics: `metrics.jsonl`, `summary.json`, wandb and the live progress line.

What: `RunLog` is the learner's one place for per-step metrics (rank 0 only). Each `log(step,
metrics)` call
  1. appends one JSON object to `run_dir/metrics.jsonl` (`step`, `policy_version`, `time_s`, then
     the metrics; keys as in docs/ALGORITHMS.md section 9) and flushes + fsyncs it, so a crash loses
     nothing already logged;
  2. forwards the scalar metrics to wandb (offline unless the user logs in; "disabled" skips it);
  3. refreshes the progress line (learner/progress.py: rich on a TTY, a compact line every
     `progress_every_s` otherwise).
`summary()` writes `summary.json` at the end of a run; `read_metrics()` reads a metrics file back
and tolerates a truncated last line (a crash mid-write).

Why our own file beside wandb: offline wandb writes no readable summary, and `rlvr compare` and
plots must work from the run folder alone. `metrics.jsonl` is the source of truth.

Resume: pass `resume_from_step=S` (the checkpoint's step). Rows with step > S (logged after the
checkpoint, before the crash) are dropped so steps continue S+1, S+2, ... with no gap or repeat;
`time_s` continues from the last kept row, and wandb resumes the same run id
(`run_dir/wandb_id.txt`). wandb drops points for steps it has already seen: those few steps after
S stay in the wandb run as first logged, `metrics.jsonl` holds the truth. A resume with no
complete checkpoint yet starts the run again at step 0: `set_aside_run` first moves the earlier
attempt's metrics, summary, plots and wandb run into `run_dir/set-aside/<time>-no-checkpoint/`,
so the new rows never mix with rows of weights that no longer exist.

Run: `python -c "from learner.run_log import read_metrics; print(read_metrics('runs/x')[-1])"`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from learner.code_version import code_version
from learner.progress import Progress, is_scalar

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
WANDB_ID_FILE = "wandb_id.txt"
RESERVED_KEYS = ("step", "policy_version", "time_s")
SET_ASIDE_DIR = "set-aside"
# what a run folder holds of one attempt's record (checkpoints, logs and config stay)
ATTEMPT_FILES = (METRICS_FILE, SUMMARY_FILE, WANDB_ID_FILE, "wandb", "plots")


# ---------------------------------------------------------------------------------------------
# JSON helpers
# ---------------------------------------------------------------------------------------------


def jsonable(value: Any, key: str = "") -> Any:
    """`value` as plain JSON: non-finite floats -> None, numpy/torch scalars and arrays -> Python
    numbers and lists. Anything else raises TypeError naming `key`."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, key) for v in value]
    if hasattr(value, "tolist"):  # numpy scalar/array, torch tensor (no import needed)
        return jsonable(value.tolist(), key)
    raise TypeError(f"metric {key!r}: cannot write a {type(value).__name__} as JSON")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to `path` via a temporary sibling and `os.replace` (readers never see half)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """All rows of `run_dir/metrics.jsonl` (or of the file itself if given a file).

    A last line that does not parse (a crash mid-write) is ignored silently; a bad line in the
    middle is skipped with a warning naming its line number. A missing file gives []."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows: list[dict] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if i != len(lines) - 1:
                log.warning("%s line %d does not parse as a JSON object; skipped", path, i + 1)
            continue
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def _means(rows: list[dict]) -> dict[str, float]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        for k, v in row.items():
            if k in RESERVED_KEYS or not is_scalar(v):
                continue
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}


def summarize(rows: list[dict]) -> dict:
    """Final metrics, last eval and run means of a list of metrics rows."""
    if not rows:
        return {"steps": 0, "last_step": None, "wall_time_s": None, "final": {}, "last_eval": {},
                "means": {}, "last10pct_means": {}}
    eval_rows = [r for r in rows if any(k.startswith("eval/") and r[k] is not None for k in r)]
    last_eval = {}
    if eval_rows:
        last = eval_rows[-1]
        last_eval = {"step": last["step"], **{k: v for k, v in last.items() if k.startswith("eval/")}}
    tail = rows[-max(1, math.ceil(len(rows) / 10)):]
    return {
        "steps": len(rows),
        "last_step": rows[-1].get("step"),
        "wall_time_s": rows[-1].get("time_s"),
        "final": rows[-1],
        "last_eval": last_eval,
        "means": _means(rows),
        "last10pct_means": _means(tail),
    }


# ---------------------------------------------------------------------------------------------
# Starting again without a checkpoint
# ---------------------------------------------------------------------------------------------


def set_aside_run(run_dir: Path, now: datetime | None = None) -> dict | None:
    """Move an earlier attempt's record (metrics.jsonl, summary.json, plots, the wandb run and
    its id) into `run_dir/set-aside/<UTC time>-no-checkpoint/`, with a NOTE.txt saying why; the
    run then starts again at step 0 in a clean folder. Returns what was moved (the folder, the
    rows and the last step they reached), or None when there was nothing to move."""
    run_dir = Path(run_dir)
    present = [name for name in ATTEMPT_FILES if (run_dir / name).exists()]
    if not present:
        return None
    rows = read_metrics(run_dir)
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    dest = run_dir / SET_ASIDE_DIR / f"{stamp}-no-checkpoint"
    n = 1
    while dest.exists():  # two restarts within a second
        n += 1
        dest = run_dir / SET_ASIDE_DIR / f"{stamp}-no-checkpoint-{n}"
    dest.mkdir(parents=True)
    last = rows[-1].get("step") if rows else None
    (dest / "NOTE.txt").write_text(
        f"Set aside at {stamp}: `--resume` found no complete checkpoint in {run_dir}, so the run\n"
        f"started again from step 0 with the initial weights. These are the earlier attempt's\n"
        f"records ({len(rows)} metrics rows, last step {last}); their weights were never saved.\n")
    for name in present:
        shutil.move(str(run_dir / name), str(dest / name))
    return {"set_aside_in": str(dest), "rows": len(rows), "last_step": last, "at": stamp}


# ---------------------------------------------------------------------------------------------
# RunLog
# ---------------------------------------------------------------------------------------------


def _prepare_metrics_file(path: Path, resume_from_step: int | None) -> list[dict]:
    """Rows to keep; rewrites the file when a partial last line or post-checkpoint rows exist."""
    if not path.exists():
        return []
    rows = read_metrics(path)
    if resume_from_step is None:
        if rows:
            raise FileExistsError(f"{path} already holds {len(rows)} rows: pass resume_from_step "
                                  "to continue this run, or use a new run folder")
        kept = []
    else:
        kept = [r for r in rows if isinstance(r.get("step"), int) and r["step"] <= resume_from_step]
    raw = path.read_text()
    if len(kept) != len(rows) or (raw and not raw.endswith("\n")) or len(raw.splitlines()) != len(rows):
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if len(kept) != len(rows):
            log.info("%s: dropped %d rows after step %s (resume)", path, len(rows) - len(kept),
                     resume_from_step)
    return kept


class RunLog:
    """Per-step metrics for one run folder: metrics.jsonl + wandb + progress line (rank 0 only).

    `total_steps` shows as step/total on the progress line; `progress_stream` defaults to stderr.
    Use as a context manager or call `close()`."""

    def __init__(self, run_dir: Path, config_dict: dict, wandb_mode: str = "offline",
                 project: str = "rlvr", progress: bool = True, resume_from_step: int | None = None,
                 total_steps: int | None = None, progress_every_s: float = 30.0,
                 progress_stream: TextIO | None = None) -> None:
        if wandb_mode not in ("offline", "online", "disabled"):
            raise ValueError(f"wandb_mode must be offline, online or disabled, not {wandb_mode!r}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        kept = _prepare_metrics_file(self.metrics_path, resume_from_step)
        self.last_step: int | None = kept[-1]["step"] if kept else None
        self.time_offset_s = float(kept[-1].get("time_s") or 0.0) if kept else 0.0
        self.t0 = time.monotonic()
        # read when the run (or its resume) starts: a commit made while it trains is not its code
        self.code = code_version()
        self.file = open(self.metrics_path, "a")
        self.wandb_run = None
        if wandb_mode != "disabled":
            self.wandb_run = self._init_wandb(config_dict, wandb_mode, project)
        self.progress = None
        if progress:
            stream = progress_stream or sys.stderr
            self.progress = Progress(total_steps, stream, progress_every_s)

    def _init_wandb(self, config_dict: dict, mode: str, project: str):
        # Everything wandb writes (runs, cache, settings, artifacts staging) stays in the run
        # folder: nothing in $HOME, nothing shared between runs. Offline mode makes no network call.
        wandb_root = self.run_dir / "wandb"
        for var, path in [("WANDB_DIR", self.run_dir), ("WANDB_CACHE_DIR", wandb_root / "cache"),
                          ("WANDB_CONFIG_DIR", wandb_root / "config"),
                          ("WANDB_DATA_DIR", wandb_root / "data")]:
            Path(path).mkdir(parents=True, exist_ok=True)
            os.environ[var] = str(path)
        id_path = self.run_dir / WANDB_ID_FILE
        if id_path.exists() and id_path.read_text().strip():
            run_id = id_path.read_text().strip()
        else:
            run_id = secrets.token_hex(4)
            id_path.write_text(run_id + "\n")
        try:
            import wandb

            settings = wandb.Settings(console="off", silent=mode != "online")
            return wandb.init(mode=mode, dir=str(self.run_dir), project=project,
                              config=json.loads(json.dumps(config_dict, default=str)), name=self.run_dir.name, id=run_id,
                              resume="allow", reinit="create_new", settings=settings)
        except Exception as e:  # the run must not die because of a dashboard
            log.warning("wandb init failed (%s: %s); logging to %s only", type(e).__name__, e,
                        self.metrics_path)
            return None

    def log(self, step: int, metrics: dict, policy_version: int | None = None) -> dict:
        """Append one row for learner step `step` (strictly increasing). `policy_version`
        defaults to metrics['policy_version'], else `step`. Returns the row as written."""
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} logged after step {self.last_step}: one row per step, "
                             "increasing")
        metrics = dict(metrics)
        pv = policy_version if policy_version is not None else metrics.get("policy_version", step)
        for k in RESERVED_KEYS:
            metrics.pop(k, None)
        elapsed_s = self.time_offset_s + time.monotonic() - self.t0
        row = {"step": step, "policy_version": pv, "time_s": round(elapsed_s, 3)}
        row.update({k: jsonable(v, k) for k, v in metrics.items()})
        self.file.write(json.dumps(row, allow_nan=False) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.last_step = step
        if self.wandb_run is not None:
            scalars = {k: v for k, v in row.items() if k != "step" and is_scalar(v)}
            try:
                self.wandb_run.log(scalars, step=step)
            except Exception as e:
                log.warning("wandb log failed at step %d (%s); continuing", step, e)
        if self.progress is not None:
            self.progress.update(step, row, elapsed_s)
        return row

    def summary(self, extra: dict | None = None) -> Path:
        """Write `summary.json`: steps, wall time, final row, last eval, run and last-10% means,
        plus `extra` (e.g. final eval results) on top, and the code's commit when the run (or
        its last resume) started. Atomic; returns its path."""
        summary = summarize(read_metrics(self.metrics_path))
        summary.update(jsonable(extra or {}, "extra"))
        summary["code"] = self.code  # which code made the run (learner/code_version.py)
        path = self.run_dir / SUMMARY_FILE
        write_json_atomic(path, summary)
        if self.wandb_run is not None:
            try:
                self.wandb_run.summary.update(
                    {k: v for k, v in summary["final"].items() if is_scalar(v)})
            except Exception as e:
                log.warning("wandb summary failed (%s)", e)
        return path

    def close(self) -> None:
        """Stop the progress line, close the file, finish wandb. Safe to call twice."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        if not self.file.closed:
            self.file.close()
        if self.wandb_run is not None:
            run, self.wandb_run = self.wandb_run, None
            try:
                run.finish()
            except Exception as e:
                log.warning("wandb finish failed (%s)", e)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
