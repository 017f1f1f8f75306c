"""Learner process entry point (started by `rlvr train`; reads RUN_DIR/config.yaml).

    python -m learner.main --run-dir runs/demo [--resume] [a.b=value ...]

With learner.ranks = R > 1, R of these run with RANK=0..R-1 (and WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) set: rank 0 leads the run, the others follow its plans (learner/ranks.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path
from typing import TextIO

import torch

from learner.progress import is_own_line, open_console
from protocol.config import load_config
# REQUEUE_EXIT_CODE makes the SLURM job requeue itself
from protocol.exit_codes import REQUEUE_EXIT_CODE, exit_at_once


def set_up_logging(rank: int, run_dir: Path) -> TextIO | None:
    """Log lines to stderr, and for rank 0 to the user: through the console `rlvr train` passed
    (returned; stderr is then logs/learner.log, rlvr/launch.py), or else with a copy in the run
    folder, since a terminal's is lost with it (a closed ssh session). The other ranks' stderr
    already goes to logs/learner-<rank>.log."""
    name = f"learner{rank}" if rank else "learner"
    log_format = f"%(asctime)s {name} %(levelname)s %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)  # stderr
    console = open_console() if rank == 0 else None
    if console is not None:  # rlvr's own lines, not its libraries'
        extra = logging.StreamHandler(console)
        extra.addFilter(is_own_line)
    elif rank == 0:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        extra = logging.FileHandler(run_dir / "logs" / "learner.log")
    else:
        return None
    extra.setFormatter(logging.Formatter(log_format))
    logging.getLogger().addHandler(extra)
    return console


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="learner")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    console = set_up_logging(rank, args.run_dir)
    cfg = load_config(args.run_dir / "config.yaml", args.overrides, run_folder=True)
    torch.set_num_threads(cfg.learner.threads)
    logging.getLogger("learner").info("torch threads %d", torch.get_num_threads())
    torch.manual_seed(cfg.run.seed)
    if rank > 0:  # a data-parallel rank: it follows rank 0's plans (learner/ranks.py)
        from learner.engine import init_learner_distributed, leave_distributed
        from learner.ranks import Follower

        init_learner_distributed(cfg, rank, cfg.learner.ranks)
        # the notice goes to every rank on SLURM; rank 0 alone decides, the others follow
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            Follower(cfg, args.run_dir).run()
        finally:
            leave_distributed()
        return 0
    # SIGUSR1 = "checkpoint and stop" (SLURM sends it before the time limit); a notice that
    # arrives while the learner is still starting is kept and honoured after its first step
    notices: list[int] = []
    signal.signal(signal.SIGUSR1, lambda *_: notices.append(1))
    from learner.engine import leave_distributed
    from learner.trainer import Learner, Preempted  # heavy imports after argument errors
    from protocol.keys import KeysError
    from protocol.transport import CannotListen

    try:
        learner = Learner(cfg, args.run_dir, args.resume, console)
    except (CannotListen, KeysError) as e:  # the user's to fix: one line naming the key
        advice = e.advice() if isinstance(e, CannotListen) else f"net.curve_dir: {e}"
        logging.getLogger("learner").error("%s", advice)
        leave_distributed()
        return 1
    signal.signal(signal.SIGUSR1, lambda *_: learner.request_preemption())
    if notices:
        learner.request_preemption()
    reason = "done"
    try:
        learner.run()
    except Preempted as stop:
        reason = "preempted"
        logging.getLogger("learner").info("preempted: checkpointed step %d, exiting for requeue",
                                          stop.args[0])
        return REQUEUE_EXIT_CODE
    finally:
        learner.close(reason)
        leave_distributed()
    return 0


if __name__ == "__main__":
    exit_at_once(main())
