"""The run's own section and its network: `run:` (steps, seed, evaluation, checkpoints,
logging) and `net:` (addresses and ports). Each class holds its keys' meaning (the docstring
under each field, which `rlvr train CONFIG --describe` prints) and their rules: `problems(cfg)`
lists the values that cannot work, each message naming its key (protocol/config/checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.config.checks import non_negative, positive


@dataclass(frozen=True)
class RunConfig:
    name: str = "demo"
    """Run folder name: outputs go to `<out_dir>/<name>/`."""
    out_dir: str = "runs"
    """Parent folder of run folders."""
    steps: int = 100
    """Learner optimizer steps (one step = one batch of `rollout.prompts_per_step` groups)."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    deterministic: bool = False
    """Take timing out of a run's schedule, so that it repeats from its seed (mode sync, HF
    engine, learner evaluation): each actor takes one work item a generation round, collects
    every verdict before its next decode step, and the learner trains a step's groups in
    hand-out order.
    Without it the decode step at which an AR3PO second stage (or any verdict) joins the batch
    follows the verifier's timing, and with it every later draw of the actor's sampler; such
    runs part within a few steps. It costs the time the actor waits for verdicts (`rlvr bench`
    numbers are taken without it). One float difference is left (docs/USAGE.md)."""
    eval_every: int = 25
    """Held-out evaluation every this many steps (and before the first and after the last)."""
    eval_on: Literal["learner", "actors"] = "learner"
    """Who runs the held-out evaluation: the learner between two steps (training waits), or the
    actors beside their training rows on a snapshot of the version just published (training
    goes on; rows carry eval/version, the final evaluation is waited for; HF engine only)."""
    checkpoint_every: int = 50
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many complete checkpoints to keep."""
    wandb: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode; offline runs can be uploaded later with `wandb sync`."""
    progress: bool = True
    """Show the live progress line."""

    def problems(self, cfg) -> list[str]:
        """Steps, evaluation, checkpoints; where evaluation runs; what determinism needs."""
        found = positive({"run.eval_every": self.eval_every,  # step % eval_every
                          "run.keep_checkpoints": self.keep_checkpoints})
        found += non_negative({"run.checkpoint_every": self.checkpoint_every})
        if self.steps < 1:
            found.append("run.steps must be >= 1")
        a = cfg.actors
        if self.eval_on == "actors" and a.engine != "hf":
            found.append(f"'run.eval_on' actors needs actors.engine hf, got {a.engine!r}: an "
                         "actor evaluates on a snapshot of the weights beside its training rows, "
                         "and only the HF engine's model can be copied so (use "
                         "run.eval_on=learner)")
        if self.deterministic and (cfg.mode != "sync" or a.engine != "hf"
                                   or self.eval_on != "learner"):
            found.append(f"'run.deterministic' needs mode sync, actors.engine hf and run.eval_on "
                         f"learner, got {cfg.mode}, {a.engine}, {self.eval_on}: an asynchronous "
                         "schedule follows the processes' timing, vLLM schedules its own "
                         "batches, and an evaluation on the actors draws from their sampler "
                         "between training rows")
        return found


@dataclass(frozen=True)
class NetConfig:
    learner_host: str = "127.0.0.1"
    """Address actors use to reach the learner."""
    bind_host: str = "127.0.0.1"
    """Address the learner binds its ZeroMQ socket to (loopback by default)."""
    zmq_port: int = 0
    """Learner's ZeroMQ port; 0 = pick a free one at launch. A port the learner cannot listen
    on (another process holds it) stops the run with one line naming the key; so do
    weights_port and master_port."""
    weights_port: int = 0
    """Weight-sync rendezvous (TCPStore) port; 0 = pick a free one at launch."""
    master_port: int = 0
    """DeepSpeed rendezvous port for learner ranks; 0 = pick a free one at launch."""
    curve_dir: str = ""
    """Folder of CurveZMQ keys (`rlvr keys DIR`); required to bind beyond loopback, and then
    every actor needs it too. `rlvr slurm submit` makes one in the run folder."""

    def problems(self, cfg) -> list[str]:
        """Ports: 0 picks a free one."""
        return [f"'net.{key}' must be a port in 0..65535 (0 = pick one), got "
                f"{getattr(self, key)}" for key in ("zmq_port", "weights_port", "master_port")
                if not 0 <= getattr(self, key) <= 65535]
