"""Which code made a run: the git commit of this checkout, and whether tracked files differed
from it. `summary.json` records it (learner/run_log.py), so that a sweep or bench reusing a
finished run can say when today's code would not have made it (rlvr/sweep.py,
rlvr/bench/common.py), and a curve built over several sessions shows which code made its cells.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def code_version(root: Path = ROOT) -> dict:
    """{"commit": sha or None, "dirty": bool or None}; None where `root` is no git checkout
    (an installed copy) or git is missing: unknown, never guessed."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    changes = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if changes is None else bool(changes)}


def label(version: dict | None) -> str:
    """`1a2b3c4`, `1a2b3c4+changes`, or `unknown` (a run from before runs recorded it)."""
    if not version or not version.get("commit"):
        return "unknown"
    return version["commit"][:7] + ("+changes" if version.get("dirty") else "")


def differs(made_by: dict | None, now: dict) -> str | None:
    """Why a run made by `made_by` may not be what the code `now` would make, or None when both
    are the same clean commit."""
    if made_by and made_by.get("commit") and made_by == now and not now.get("dirty"):
        return None
    return f"made by code {label(made_by)}, code now {label(now)}"
