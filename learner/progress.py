"""The live progress line of a run: rich on a TTY, a compact line every few seconds otherwise.

What: `format_progress` renders step/total, accuracy, responses per prompt, staleness, tokens/s
and the last eval as one line; `Progress` shows it as a rich live line on a terminal, or prints
it at most every `every_s` seconds (and at the last step) on a pipe or file, so a SLURM log
stays readable. `RunLog` (learner/run_log.py) feeds it one row per step.

Run the tests with: .venv/bin/python -m pytest tests/test_run_log.py
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, TextIO

CONSOLE_FD_ENV = "RLVR_CONSOLE_FD"
"""Names the descriptor `rlvr train` hands its learner for the lines meant for the user
(rlvr/launch.py); the learner's stdout and stderr go to logs/learner.log with everything its
libraries print (progress bars, warnings)."""
OWN_PACKAGES = ("learner", "actors", "protocol", "tasks", "rlvr")


def open_console() -> TextIO | None:
    """The user's terminal when the launcher passed one, else None. The variable is removed, so
    that no process this one starts looks for a descriptor it was not given."""
    fd = os.environ.pop(CONSOLE_FD_ENV, None)
    return os.fdopen(int(fd), "w", buffering=1) if fd else None


def is_own_line(record) -> bool:
    """A log record of rlvr's own code (not a library's)."""
    return record.name.split(".", 1)[0] in OWN_PACKAGES


def is_scalar(value: Any) -> bool:
    """A metric value that is a number (bools are flags, not numbers)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fmt_duration(seconds: float) -> str:
    s = int(max(0, seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s % 60:02d}s"


def _fmt_rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s / 1000:.1f}k" if tokens_per_s >= 1000 else f"{tokens_per_s:.0f}"


def format_progress(step: int, total_steps: int | None, latest: dict, elapsed_s: float,
                    eta_s: float | None = None) -> str:
    """One compact line: step/total, reward, responses per prompt, staleness, tokens/s, eval."""
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    fields = [("reward/acc_mean", "acc {:.3f}"), ("gen/responses_per_prompt", "resp/prompt {:.2f}"),
              ("stale/max", "stale max {:g}"), ("eval/avg@8", "avg@8 {:.3f}")]
    for key, fmt in fields:
        if is_scalar(latest.get(key)):
            parts.append(fmt.format(latest[key]))
    if is_scalar(latest.get("perf/gen_tokens_per_s")):
        parts.append(f"{_fmt_rate(latest['perf/gen_tokens_per_s'])} tok/s")
    parts.append(fmt_duration(elapsed_s) + (f" (eta {fmt_duration(eta_s)})" if eta_s else ""))
    return " | ".join(parts)


class Progress:
    """Rich live line on a TTY; on a pipe/file, one plain line every `every_s` seconds."""

    def __init__(self, total_steps: int | None, stream: TextIO, every_s: float) -> None:
        self.total_steps, self.stream, self.every_s = total_steps, stream, every_s
        self.latest: dict = {}  # last value seen per key (eval comes every few steps)
        self.last_print = -math.inf
        self.first_step: int | None = None
        self.t0 = time.monotonic()
        self.live = None
        if stream.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(file=stream), auto_refresh=False, transient=False)
            self.live.start()

    def update(self, step: int, row: dict, elapsed_s: float) -> None:
        self.latest.update({k: v for k, v in row.items() if v is not None})
        if self.first_step is None:
            self.first_step, self.t0 = step, time.monotonic()
        eta_s = None
        done = step - self.first_step
        if self.total_steps and done > 0:
            eta_s = (time.monotonic() - self.t0) / done * (self.total_steps - step)
        line = format_progress(step, self.total_steps, self.latest, elapsed_s, eta_s)
        if self.live is not None:
            from rich.text import Text

            self.live.update(Text(line), refresh=True)
            return
        now = time.monotonic()
        if now - self.last_print >= self.every_s or step == self.total_steps:
            print(line, file=self.stream, flush=True)
            self.last_print = now

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
