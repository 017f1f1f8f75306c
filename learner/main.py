"""Learner process entry point (started by `rlvr train`; reads RUN_DIR/config.yaml).

    python -m learner.main --run-dir runs/demo [--resume] [a.b=value ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from protocol.config import load_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="learner")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner %(levelname)s %(message)s")
    cfg = load_config(args.run_dir / "config.yaml", args.overrides)
    torch.set_num_threads(cfg.learner.threads)
    torch.manual_seed(cfg.run.seed)
    from learner.trainer import Learner  # heavy imports after argument errors are reported

    learner = Learner(cfg, args.run_dir, args.resume)
    try:
        learner.run()
    finally:
        learner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
