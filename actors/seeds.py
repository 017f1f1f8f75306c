"""Each actor process samples from its own random stream: seeded by the run's seed, its actor id
and how many times that actor has started in this run folder (restarts by the launcher, SLURM
requeues and resumes all count), so two actors never draw the same samples and a restarted actor
does not repeat its first ones. Every start is recorded in RUN_DIR/actors/actor<i>-start<n>.json
(seed, pid, host), which is all it takes to reproduce an actor's stream.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path


def actor_seed(run_seed: int, actor_id: int, start: int) -> int:
    """A 31-bit seed for (run seed, actor, start): distinct streams for every actor and start,
    and the same number again from the same three (vLLM and torch both take it)."""
    digest = hashlib.sha256(f"rlvr-actor/{run_seed}/{actor_id}/{start}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def claim_start(run_dir: Path, actor_id: int, run_seed: int) -> tuple[int, int]:
    """(start number, seed) of this process: the first `start` not yet recorded for `actor_id`
    in `run_dir`, claimed by creating its record exclusively (two processes never get the same
    one, also on a shared file system's O_EXCL)."""
    folder = Path(run_dir) / "actors"
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    while True:
        path = folder / f"actor{actor_id}-start{start}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            start += 1
            continue
        seed = actor_seed(run_seed, actor_id, start)
        with os.fdopen(fd, "w") as f:
            json.dump({"actor_id": actor_id, "start": start, "run_seed": run_seed, "seed": seed,
                       "pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}, f)
        return start, seed
