"""What a learner step's update takes from the run config, in one frozen value
(`UpdateSpec.of(cfg)`): the loss, the micro- and mini-batch shapes, the learning-rate schedule,
the group order and the optional Mu-GRPO veto and GCPO term. Its own module because both the
update loop (learner/update.py) and the loss of one micro-batch (learner/micro_loss.py) read it."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.config.algorithms import GCPOConfig, MuGRPOConfig
from protocol.config import Config, LossConfig


@dataclass(frozen=True)
class UpdateSpec:
    """What a learner step's update takes from the run config (`UpdateSpec.of(cfg)`)."""

    loss: LossConfig
    max_new_tokens: int  # Dr. GRPO's constant length normaliser
    temperature: float = 1.0  # the actors' sampling temperature: log-probs of softmax(z / T)
    micro_batch: int = 256  # most sequences per micro-batch
    max_tokens: int | None = None  # most padded tokens per micro-batch
    mini_batches: int = 1  # optimizer steps per pass over the batch
    epochs: int = 1  # passes over the batch
    lr: float = 2e-4  # optim.lr, reached after the warm-up
    warmup_steps: int = 0  # optim.warmup_steps, in learner steps
    order_seed: int | None = None  # shuffle groups into mini-batches per pass; None = arrival
    veto: MuGRPOConfig | None = None  # Mu-GRPO's negative-advantage veto, when on
    gcpo: GCPOConfig | None = None  # GCPO's contrastive term, when on

    @classmethod
    def of(cls, cfg: Config) -> UpdateSpec:
        return cls(cfg.loss, cfg.rollout.max_new_tokens,
                   cfg.rollout.temperature,  # > 0: Config refuses greedy training
                   cfg.learner.micro_batch, cfg.learner.max_tokens_per_micro_batch,
                   cfg.optim.mini_batches, cfg.optim.epochs, cfg.optim.lr, cfg.optim.warmup_steps,
                   cfg.run.seed if cfg.optim.group_order == "shuffled" else None,
                   veto=cfg.mugrpo if cfg.mugrpo.veto_scope != "off" else None,
                   gcpo=cfg.gcpo if cfg.gcpo.coef > 0 else None)

    @property
    def optimizer_steps(self) -> int:
        return self.mini_batches * self.epochs

    def group_order(self, step: int, epoch: int) -> str | None:
        """The seed that deals learner step `step`'s groups into the mini-batches of pass
        `epoch` (the same string on every rank and after a resume), None = arrival order."""
        return None if self.order_seed is None else f"{self.order_seed}/{step}/{epoch}"
