"""Actor process entry point (started by `rlvr train`; reads RUN_DIR/config.yaml).

    python -m actors.main --run-dir runs/demo --actor-id 0 [a.b=value ...]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from actors.seeds import claim_start
from protocol.config import load_config
from protocol.exit_codes import exit_at_once


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="actor")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--actor-id", required=True, type=int)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s actor{args.actor_id} %(levelname)s %(message)s")
    cfg = load_config(args.run_dir / "config.yaml", args.overrides, run_folder=True)
    torch.set_num_threads(cfg.actors.threads)
    logging.getLogger("actor").info("torch threads %d", torch.get_num_threads())
    start, seed = claim_start(args.run_dir, args.actor_id, cfg.run.seed)
    logging.getLogger("actor").info("start %d of actor %d: sampling seed %d", start,
                                    args.actor_id, seed)
    torch.manual_seed(seed)
    from actors.worker import run_actor  # heavy imports after argument errors are reported

    return run_actor(cfg, args.actor_id, seed)


if __name__ == "__main__":
    exit_at_once(main())
