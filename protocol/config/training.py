"""The learner's side: `loss:` (advantage, ratio, clipping, KL), `optim:` (the optimizer and
its steps) and `learner:` (ranks, threads, micro-batches). Each class holds its keys' meaning
and their rules: `problems(cfg)` and, for the loss, `inert(cfg)` (protocol/config/checks.py,
inert.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.config.checks import non_negative, positive

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


@dataclass(frozen=True)
class LossConfig:
    advantage: Literal["grpo", "drgrpo", "rloo"] = "grpo"
    """Group advantage estimator (docs/ALGORITHMS.md 1.2)."""
    old_policy: Literal["proximal", "behaviour"] = "proximal"
    """Denominator of the PPO ratio: 'proximal' = decoupled PPO, the learner's weights at the
    start of the learner step (before its first optimizer step), with the behaviour weight
    w = pi_prox / pi_behav (8.3); 'behaviour' = the stored behaviour log-probs, w = 1 (Mu-GRPO,
    5.2)."""
    std_mode: Literal["unbiased", "population"] = "unbiased"
    """Std used by the GRPO advantage."""
    aggregation: Aggregation = "seq-mean-token-mean"
    """Loss aggregation (docs/ALGORITHMS.md 1.4); denominators span the whole step's batch."""
    clip_low: float = 0.2
    """PPO clip epsilon below 1."""
    clip_high: float = 0.2
    """PPO clip epsilon above 1 (DAPO clip-higher uses 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages; null = off."""
    behav_weight_cap: float = 2.0
    """Decoupled PPO: cap C on the behaviour weight pi_prox / pi_behav (docs/ALGORITHMS.md 8.3)."""
    behav_weight_mode: Literal["truncate", "mask", "off"] = "truncate"
    """Decoupled PPO weight: truncate at C, mask tokens above C, or off (w = 1). Both keys act
    only under old_policy proximal (under behaviour w = 1)."""
    trust_region: Literal["clip", "m2po"] = "clip"
    """How the update is kept near the policy that sampled the data: 'clip' = the PPO clip
    (clip_low, clip_high, dual_clip); 'm2po' = M2PO's second-moment mask (docs/ALGORITHMS.md 8.2c):
    no clip, the ratio to the behaviour policy times the advantage, with the trust-region tokens
    of largest (log r)^2 masked until their mean is <= m2po_tau. Needs old_policy behaviour."""
    m2po_tau: float = 0.04
    """M2PO's threshold on the mean (log pi_theta - log pi_behav)^2 of the trust-region tokens
    left in the loss (the paper's 0.04 in every experiment)."""
    kl_beta: float = 0.0
    """KL penalty coefficient (docs/ALGORITHMS.md 1.5) against the reference policy: a frozen copy of
    the initial weights (model.path, also after a resume), kept on each learner rank (under
    ZeRO-3 as an inference-only ZeRO-3 engine, its parameters offloaded to CPU memory on GPU).
    0 = no reference model is loaded and no reference log-probs are computed."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator with x = log pi_ref - log pi_theta: k1 = -x, k2 = x^2 / 2,
    k3 = e^x - x - 1 (>= 0, GRPO's)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (the entropy of the sampling distribution, softmax(logits / T))."""

    def problems(self, cfg) -> list[str]:
        """The clip range, the behaviour weight's cap, M2PO's threshold and what it needs."""
        found = []
        if not 0 <= self.clip_low <= 1 or self.clip_high < 0:
            found.append(f"'loss.clip_low' must be in [0, 1] and 'loss.clip_high' >= 0, got "
                         f"{self.clip_low} and {self.clip_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            found.append(f"'loss.dual_clip' must be > 1 or null, got {self.dual_clip}")
        if not self.behav_weight_cap > 0:
            found.append(f"'loss.behav_weight_cap' must be > 0, got {self.behav_weight_cap}")
        if not self.m2po_tau > 0:
            found.append(f"'loss.m2po_tau' must be > 0, got {self.m2po_tau} (0 would mask every "
                         "trust-region token)")
        if self.trust_region == "m2po" and self.old_policy != "behaviour":
            found.append("'loss.trust_region' m2po needs loss.old_policy behaviour (got "
                         f"{self.old_policy}): M2PO bounds the ratio to the policy that sampled "
                         "the data, with no proximal policy and no behaviour weight")
        if self.kl_beta < 0:
            found.append(f"'loss.kl_beta' must be >= 0 (0 = no KL term), got {self.kl_beta}")
        return found

    def inert(self, cfg) -> list[tuple[str, str]]:
        """The behaviour weight's knobs, the trust region's other knobs, the KL kind without
        KL."""
        found = []
        if self.old_policy == "behaviour":
            for key in ("behav_weight_cap", "behav_weight_mode"):
                if getattr(self, key) != getattr(LossConfig, key):
                    found.append((f"loss.{key}", f"'loss.{key}' ({getattr(self, key)}) does "
                                  "nothing under loss.old_policy behaviour: the ratio is to the "
                                  "behaviour policy itself and w = 1"))
        elif (self.behav_weight_mode == "off"
              and self.behav_weight_cap != LossConfig.behav_weight_cap):
            found.append(("loss.behav_weight_cap", f"'loss.behav_weight_cap' "
                          f"({self.behav_weight_cap}) does nothing with loss.behav_weight_mode "
                          "off (w = 1)"))
        if self.trust_region == "m2po":
            for key in ("clip_low", "clip_high", "dual_clip"):
                if getattr(self, key) != getattr(LossConfig, key):
                    found.append((f"loss.{key}", f"'loss.{key}' ({getattr(self, key)}) does "
                                  "nothing with loss.trust_region m2po: M2PO masks tokens "
                                  "instead of clipping the ratio"))
        elif self.m2po_tau != LossConfig.m2po_tau:
            found.append(("loss.m2po_tau", f"'loss.m2po_tau' ({self.m2po_tau}) does nothing with "
                          "loss.trust_region clip"))
        if self.kl_beta == 0 and self.kl_kind != LossConfig.kl_kind:
            found.append(("loss.kl_kind", f"'loss.kl_kind' ({self.kl_kind}) does nothing with "
                          "loss.kl_beta 0 (no KL term)"))
        return found


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-4
    """AdamW learning rate."""
    warmup_steps: int = 10
    """Linear warm-up, in learner steps: the learning rate is constant over the optimizer steps
    of one learner step (mini_batches x epochs of them) and reaches optim.lr at this step."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (0-3)."""
    bf16: bool = False
    """Train in bf16 (DeepSpeed mixed precision)."""
    mini_batches: int = 1
    """Optimizer steps per pass over a learner step's batch: the step's groups are split, whole,
    into this many mini-batches (DAPO: 512 prompts in mini-batches of 32 = 16). The proximal
    log-probs (docs/ALGORITHMS.md 8.3) are computed once, with the weights at the start of the learner
    step, so from the second mini-batch on the ratio pi_theta / pi_prox moves away from 1 and
    the clip terms act; each optimizer step's loss has its own mini-batch's denominators (1.4).
    policy_version still counts learner steps (one rollout batch), not optimizer steps, as in
    AReaL: staleness and admission (max_staleness) are in learner steps."""
    epochs: int = 1
    """Passes over the learner step's batch (PPO epochs); each pass takes `mini_batches`
    optimizer steps. AERO: GRPO epochs 1."""
    group_order: Literal["shuffled", "arrival"] = "shuffled"
    """How whole groups are dealt into the mini-batches of each pass: shuffled = a fresh order
    per pass, seeded by (run.seed, learner step, pass), so it is the same on every rank and after
    a resume; arrival = the order the groups came back in, which is generation time: the last
    mini-batches would hold the longest and latest-stage groups, trained furthest from the
    proximal policy (`mb/clip_frac` and `mb/len_mean` per mini-batch show it). Acts only with
    mini_batches > 1."""

    def problems(self, cfg) -> list[str]:
        """The learning rate and schedule, the ZeRO stage, optimizer steps per learner step."""
        found = positive({"optim.lr": self.lr})
        found += non_negative({"optim.warmup_steps": self.warmup_steps,
                               "optim.weight_decay": self.weight_decay,
                               "optim.grad_clip": self.grad_clip})
        if not 0 <= self.zero_stage <= 3:
            found.append(f"'optim.zero_stage' must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.mini_batches < 1:
            found.append(f"'optim.mini_batches' must be >= 1 (optimizer steps per learner "
                         f"step), got {self.mini_batches}")
        if self.epochs < 1:
            found.append(f"'optim.epochs' must be >= 1 (passes over a learner step's batch), "
                         f"got {self.epochs}")
        if self.group_order != OptimConfig.group_order and self.mini_batches == 1:
            found.append(f"'optim.group_order' ({self.group_order}) acts only with "
                         "optim.mini_batches > 1: one mini-batch holds every group, in any order")
        per_step = cfg.rollout.prompts_per_step
        if self.mini_batches > per_step:
            found.append(f"'optim.mini_batches' ({self.mini_batches}) must be <= "
                         f"'rollout.prompts_per_step' ({per_step}): a mini-batch holds whole "
                         "groups, at least one")
        return found


@dataclass(frozen=True)
class LearnerConfig:
    ranks: int = 1
    """Data-parallel learner ranks (DeepSpeed)."""
    threads: int = 1
    """Torch CPU threads per learner rank."""
    micro_batch: int = 256
    """Most sequences per forward/backward micro-batch (gradients accumulate over the optimizer
    step). A micro-batch is also bounded by max_tokens_per_micro_batch; both limits hold."""
    max_tokens_per_micro_batch: int | None = None
    """Most padded tokens (sequences x longest prompt+response) per forward/backward micro-batch;
    rows are sorted by length, so micro-batches of long rows hold few of them. A row longer than
    the budget gets a micro-batch of its own. null = bounded by micro_batch alone. The log-probs
    never hold the whole micro-batch's logits (learner/logprobs.py), so activation memory grows
    with this budget, not with budget x vocabulary."""
    grad_checkpointing: bool = False
    """Recompute activations in the backward pass (large models on GPU)."""

    def problems(self, cfg) -> list[str]:
        """Ranks, threads and the micro-batches' size."""
        found = positive({"learner.threads": self.threads,
                          "learner.micro_batch": self.micro_batch})
        if self.ranks < 1:
            found.append("learner.ranks must be >= 1")
        if self.ranks > 1 and cfg.optim.zero_stage == 3:
            found.append("learner.ranks > 1 with optim.zero_stage 3 is not supported: evaluation "
                         "and weight publishing run on rank 0 alone, which needs every parameter "
                         "whole there (use ZeRO stage 0-2)")
        budget, max_new = self.max_tokens_per_micro_batch, cfg.rollout.max_new_tokens
        if budget is not None and budget <= max_new:
            found.append(f"'learner.max_tokens_per_micro_batch' ({budget}) must exceed "
                         f"'rollout.max_new_tokens' ({max_new}): it is smaller than one "
                         "full-length sequence (prompt + response)")
        return found
