"""Thresholds on timings and learning outcomes, and the runs they were calibrated on.

A test that asserts on a number that varies from run to run (a timeout's elapsed time, a
learning gain, a sampled accuracy) records it first:

    elapsed = time.monotonic() - start
    record("recv(timeout_s=0.2) returns after s", elapsed, low=0.15, high=2.0)
    assert 0.15 < elapsed < 2.0

`record` does nothing unless RLVR_CALIBRATION_LOG names a file, where it appends one JSON line.
This module's command runs tests repeatedly with that file set and prints, per recorded value,
its mean and spread over the runs and how many standard deviations its bound sits from the mean:

    .venv/bin/python -m tests.calibration --runs 5 tests/test_transport.py tests/test_weights.py

A bound closer than 3 standard deviations to the mean fails that command (a flaky test); the
table it prints is the one in tests/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOG_ENV = "RLVR_CALIBRATION_LOG"
MIN_SIGMAS = 3.0


def record(name: str, value: float, low: float | None = None, high: float | None = None) -> None:
    """Note `value` for calibration. `low` and `high` are where the test fails: it asserts
    low < value < high (either side optional), so `assert n >= 1` on a count records low=0."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    with open(path, "a") as f:
        f.write(json.dumps({"test": test, "name": name, "value": float(value), "low": low,
                            "high": high}) + "\n")


def summarize(lines: list[dict]) -> list[dict]:
    """Per (test, name): runs, mean, standard deviation and the nearest bound's distance in
    standard deviations (inf when the value never varied and the bound holds)."""
    by_key: dict[tuple[str, str], list[dict]] = {}
    for line in lines:
        by_key.setdefault((line["test"], line["name"]), []).append(line)
    rows = []
    for (test, name), got in sorted(by_key.items()):
        values = [g["value"] for g in got]
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        gaps = [mean - got[0]["low"]] if got[0]["low"] is not None else []
        gaps += [got[0]["high"] - mean] if got[0]["high"] is not None else []
        gap = min(gaps)
        sigmas = gap / sd if sd > 0 else (float("inf") if gap > 0 else 0.0)
        rows.append({"test": test, "name": name, "runs": len(values), "mean": mean, "sd": sd,
                     "low": got[0]["low"], "high": got[0]["high"], "sigmas": sigmas})
    return rows


def table(rows: list[dict]) -> str:
    def num(x):
        return "" if x is None else f"{x:.4g}"
    out = ["| test | value | runs | mean | sd | passes strictly inside | sd to bound |",
           "|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        bound = (f"({num(r['low']) if r['low'] is not None else '-inf'}, "
                 f"{num(r['high']) if r['high'] is not None else 'inf'})")
        out.append(f"| `{r['test']}` | {r['name']} | {r['runs']} | {num(r['mean'])} | "
                   f"{num(r['sd'])} | {bound} | {r['sigmas']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--log", help="append to this JSON-lines file (default: a temporary one)")
    ap.add_argument("tests", nargs="+", help="pytest node ids or files")
    args = ap.parse_args(argv)
    if args.log:
        log = Path(args.log)
    else:
        with tempfile.NamedTemporaryFile(suffix=".jsonl", prefix="calibration-", delete=False) as f:
            log = Path(f.name)
    env = {**os.environ, LOG_ENV: str(log)}
    for i in range(args.runs):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *args.tests], env=env)
        print(f"calibration: run {i + 1}/{args.runs} exited {done.returncode}", flush=True)
    lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    rows = summarize(lines)
    print(table(rows))
    print(f"calibration: values in {log}")
    tight = [r for r in rows if r["sigmas"] < MIN_SIGMAS]
    for r in tight:
        print(f"calibration: {r['test']} {r['name']}: bound {r['sigmas']:.1f} sd from the mean",
              file=sys.stderr)
    return 1 if tight or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
