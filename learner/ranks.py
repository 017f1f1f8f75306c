"""Data-parallel learner ranks: rank 0 leads, ranks 1..R-1 follow its plan.

Rank 0 alone talks to the actors, builds each step's batch, evaluates and logs. Before every
collective action it broadcasts a plan to the other ranks over the learners' default process
group (gloo on CPU, NCCL on GPU): `load` a checkpoint (at start), `train` these rows, `checkpoint`
this step, `stop`. Every rank then runs the same `train_step` on its share of the rows, and
DeepSpeed averages the gradients across ranks (learner/update.py shards the rows and keeps the
step-global loss denominators, so R ranks take the same step as one).

Plans are msgpack (msgspec) in a uint8 tensor: plain lists and numbers, never pickle, even
between our own processes.

    followers: python -m learner.main --run-dir runs/x   with RANK=1.. WORLD_SIZE=R set
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist

from learner.update import (ContrastGroup, LossRow, UpdateSpec, collective_device,
                            policy_update, rank_and_world)
from protocol.config import Config

log = logging.getLogger(__name__)

_ROW_FIELDS = [f.name for f in dataclasses.fields(LossRow)]


# ---------------------------------------------------------------------------------------------
# Plans on the wire
# ---------------------------------------------------------------------------------------------


def encode_plan(kind: str, **fields) -> bytes:
    plan = {"kind": kind, **fields}
    if "rows" in plan:
        plan["rows"] = [[getattr(r, f) for f in _ROW_FIELDS] for r in plan["rows"]]
    if "contrasts" in plan:
        plan["contrasts"] = [[c.prompt, c.golden, c.failures] for c in plan["contrasts"]]
    return msgspec.msgpack.encode(plan)


def decode_plan(data: bytes) -> dict:
    plan = msgspec.msgpack.decode(data)
    if "rows" in plan:
        plan["rows"] = [LossRow(**dict(zip(_ROW_FIELDS, values))) for values in plan["rows"]]
    if "contrasts" in plan:
        plan["contrasts"] = [ContrastGroup(p, g, f) for p, g, f in plan["contrasts"]]
    return plan


class PlanChannel:
    """Broadcast of rank 0's plans to the other learner ranks on the default group."""

    def __init__(self):
        self.rank, self.world = rank_and_world()
        self.device = collective_device() if self.world > 1 else torch.device("cpu")

    def tell(self, kind: str, **fields) -> None:
        """Rank 0: send a plan to every other rank (a no-op with one rank)."""
        if self.world == 1:
            return
        data = encode_plan(kind, **fields)
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=0)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        dist.broadcast(payload, src=0)

    def receive(self) -> dict:
        """Ranks 1..R-1: the next plan from rank 0."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=0)
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(payload, src=0)
        return decode_plan(payload.cpu().numpy().tobytes())


# ---------------------------------------------------------------------------------------------
# The step every rank takes
# ---------------------------------------------------------------------------------------------


def train_step(engine, cfg: Config, pad_id: int, rows: list[LossRow],
               contrasts: list[ContrastGroup], reference=None, step: int = 0) -> dict:
    """Learner step `step` (optim.mini_batches x optim.epochs optimizer steps) on the whole batch;
    each rank works on its share (learner/update.py). reference: the KL reference model."""
    return policy_update(engine, rows, UpdateSpec.of(cfg), pad_id, contrasts, reference, step)


class Leader:
    """Learner rank 0's model: the trained engine and the KL reference, with every step, load
    and checkpoint told to the follower ranks first (a no-op channel with one rank)."""

    def __init__(self, cfg: Config, run_dir: Path, tokenizer):
        from learner.engine import build_engine, build_reference

        self.cfg, self.run_dir, self.tokenizer = cfg, run_dir, tokenizer
        self.engine = build_engine(cfg, cfg.model.path)
        self.reference = build_reference(cfg, self.engine)  # KL: the initial weights, always
        self.followers = PlanChannel()
        self.checkpointed_step: int | None = None

    def load(self, path: Path) -> dict:
        """Every rank restores the checkpoint at `path`; returns its run state."""
        from learner.checkpoint import load_checkpoint

        self.followers.tell("load", path=str(path))
        return load_checkpoint(path, self.engine)

    def train(self, rows: list[LossRow], contrasts: list[ContrastGroup], step: int) -> dict:
        self.followers.tell("train", rows=rows, contrasts=contrasts, step=step)
        return train_step(self.engine, self.cfg, self.tokenizer.pad_token_id, rows, contrasts,
                          self.reference, step)

    def checkpoint(self, step: int, run_state: dict) -> None:
        """Checkpoint step `step` with `run_state` beside the weights (once per step)."""
        from learner.checkpoint import save_checkpoint

        if self.checkpointed_step == step:
            return
        self.checkpointed_step = step
        self.followers.tell("checkpoint", step=step)
        save_checkpoint(self.run_dir, step, self.engine, self.tokenizer, run_state,
                        keep_last=self.cfg.run.keep_checkpoints)

    def stop(self, reason: str) -> None:
        try:
            self.followers.tell("stop", reason=reason)
        except Exception as e:  # noqa: BLE001 - ranks already gone; the launcher stops them
            log.warning("could not tell the other learner ranks to stop: %s", e)


class Follower:
    """Learner rank 1..R-1: an engine that does what rank 0's plans say, until `stop`."""

    def __init__(self, cfg: Config, run_dir: Path):
        from tasks.tiny_model import load_tokenizer

        from learner.engine import build_engine, build_reference

        self.cfg, self.run_dir = cfg, run_dir
        self.pad_id = load_tokenizer(cfg.model.path).pad_token_id
        self.engine = build_engine(cfg, cfg.model.path)
        self.reference = build_reference(cfg, self.engine)  # the initial weights, always
        self.channel = PlanChannel()

    def run(self) -> None:
        from learner.checkpoint import load_checkpoint, save_checkpoint

        while True:
            plan = self.channel.receive()
            match plan["kind"]:
                case "load":
                    load_checkpoint(plan["path"], self.engine)
                case "train":
                    train_step(self.engine, self.cfg, self.pad_id, plan["rows"], plan["contrasts"],
                               self.reference, plan["step"])
                case "checkpoint":  # collective under ZeRO; rank 0 writes the run state
                    save_checkpoint(self.run_dir, plan["step"], self.engine, None, {},
                                    keep_last=self.cfg.run.keep_checkpoints)
                case "stop":
                    log.info("rank %d: stop (%s)", self.channel.rank, plan.get("reason", ""))
                    return
                case other:
                    raise RuntimeError(f"unknown plan kind {other!r} from rank 0")
