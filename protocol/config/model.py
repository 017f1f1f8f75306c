"""The model and its warm start: `model:` (a checkpoint, or the embedded tiny model's shape, and
`model.lora:`, the adapter trained instead of every weight) and `warm_start:` (the tiny model's
supervised start). Each class holds its keys' meaning and their rules (`problems(cfg)`, `inert`;
protocol/config/checks.py, inert.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from protocol.config.checks import non_negative, positive


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 0
    """LoRA: train a low-rank adapter of this rank (r) on `target_modules` instead of every
    weight; 0 = off. The learner keeps optimizer state for the adapter alone, and the KL
    reference is the base model with the adapter switched off (no second copy). Raise
    optim.lr about 10x over full fine-tuning (docs/TRAINING.md, "LoRA")."""
    alpha: float = 32.0
    """The adapter's scale: its update is (alpha / rank) B A."""
    dropout: float = 0.0
    """Dropout on the adapter's input in training passes, in [0, 1)."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Module names the adapter wraps (PEFT's target_modules): the default, all-linear, is every
    linear layer of the decoder blocks, not the embeddings or the LM head."""

    def problems(self, cfg) -> list[str]:
        """The rank, scale and dropout; what LoRA cannot run with."""
        found = non_negative({"model.lora.rank": self.rank})
        found += positive({"model.lora.alpha": self.alpha})
        if not 0 <= self.dropout < 1:
            found.append(f"'model.lora.dropout' must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            found.append("'model.lora.target_modules' must name at least one module (default: "
                         "all-linear)")
        if self.rank > 0 and cfg.optim.zero_stage == 3:
            found.append(f"'model.lora.rank' ({self.rank}) is not supported with optim.zero_stage "
                         "3: the checkpoint and the weights sent to the actors merge the "
                         "adapter into whole weights (use ZeRO stage 0-2)")
        return found

    def inert(self, cfg) -> list[tuple[str, str]]:
        """The adapter's knobs with no adapter."""
        if self.rank > 0:
            return []
        return [(f"model.lora.{key}", f"'model.lora.{key}' ({getattr(self, key)}) does nothing "
                 "with model.lora.rank 0 (no adapter)")
                for key in ("alpha", "dropout", "target_modules")
                if getattr(self, key) != getattr(LoraConfig, key)]


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """Hugging Face model folder or hub name; empty = the embedded tiny model, warm-started here."""
    device: str = "cpu"
    """Torch device for the learner and the actor engines ('cpu' or 'cuda')."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the actor engine; the learner trains in float32 or bf16 (DeepSpeed)."""
    hidden: int = 128
    """Tiny model: hidden size."""
    layers: int = 4
    """Tiny model: transformer layers."""
    heads: int = 4
    """Tiny model: attention heads."""
    ffn: int = 512
    """Tiny model: MLP width."""
    max_positions: int = 256
    """Tiny model: the longest prompt + response it takes, in tokens (max_position_embeddings;
    vLLM's max_model_len unless actors.max_model_len says less)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """A LoRA adapter trained instead of every weight (off: rank 0)."""

    def problems(self, cfg) -> list[str]:
        """The tiny model's shape, the device, the positions a response needs."""
        found = positive({"model.hidden": self.hidden, "model.layers": self.layers,
                          "model.heads": self.heads, "model.ffn": self.ffn})
        if self.heads > 0 and self.hidden % self.heads:
            found.append(f"'model.hidden' ({self.hidden}) must be a multiple of 'model.heads' "
                         f"({self.heads})")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            found.append(f"'model.device' must be cpu, cuda or cuda:N, got {self.device!r}")
        max_new = cfg.rollout.max_new_tokens
        if not self.path and self.max_positions <= max_new:
            found.append(f"'model.max_positions' ({self.max_positions}) must exceed "
                         f"'rollout.max_new_tokens' ({max_new}): the tiny model's "
                         "positions hold prompt + response")
        return found + self.lora.problems(cfg)

    def inert(self, cfg) -> list[tuple[str, str]]:
        return self.lora.inert(cfg)


@dataclass(frozen=True)
class WarmStartConfig:
    steps: int = 800
    """Supervised steps on the synthetic task before RL (tiny model only; cached)."""
    batch_size: int = 128
    """Supervised batch size."""
    lr: float = 3e-3
    """Peak supervised learning rate (warm-up then cosine decay)."""
    label_noise: float = 0.3
    """Probability that a supervised target has one digit replaced by a wrong one: the warm start
    imitates a sloppy teacher, so sampling at temperature 1 often slips while the most likely
    answer is right. That gap between sampled and greedy accuracy is what RL with a verifier
    closes, visibly, within a demo's minutes."""
    micro_batch: int | None = None
    """Rows per forward pass of the warm start, the batch sorted by length first; the step's
    gradient is the whole batch's either way. For long-tail answers: one 230-token row no longer
    pads the whole batch to its width (the long-tail task's 64-row step: 0.65-0.8 s against 2.0 s
    in one pass). null = one pass."""
    cache_dir: str = ".cache/rlvr"
    """The project's cache: warm-started models, keyed by a hash of everything that shapes them,
    and the model folders that passed `rlvr train`'s check (rlvr/data_check.py)."""
    source: Literal["arithmetic", "task"] = "arithmetic"
    """What the tiny model is warm-started on: the synthetic arithmetic task, or the task's own
    training rows, imitating each row's solution (task.solution_field, required then) from the
    same sloppy teacher: one digit wrong with probability label_noise (task.kind file)."""
    level_weights: tuple[float, ...] | None = None
    """Sampling weight of each of task.levels during the warm start; null = task.level_weights.
    A level weighted 0 here but not in task.level_weights is one the warm start never teaches:
    it stays hard during RL (all-wrong groups) and in evaluation."""

    def problems(self, cfg) -> list[str]:
        """The warm start's batch, steps, label noise, source and length mix."""
        found = positive({"warm_start.batch_size": self.batch_size, "warm_start.lr": self.lr})
        found += non_negative({"warm_start.steps": self.steps})
        if self.micro_batch is not None and self.micro_batch < 1:
            found.append(f"'warm_start.micro_batch' must be >= 1 (rows per pass) or null, got "
                         f"{self.micro_batch}")
        if not 0 <= self.label_noise <= 1:
            found.append(f"'warm_start.label_noise' must be in [0, 1], got {self.label_noise}")
        t, w = cfg.task, self.level_weights
        if w is not None and len(w) != len(t.levels):
            found.append("warm_start.level_weights must have one weight per entry of task.levels")
        if w is not None and t.kind == "arithmetic" and (any(x < 0 for x in w) or not sum(w) > 0):
            found.append(f"'warm_start.level_weights' must be >= 0 with a positive sum, got "
                         f"{list(w)}")
        if self.source == "task" and t.kind != "file":
            found.append("'warm_start.source' task warm-starts the embedded tiny model on a file "
                         f"task's solutions: it needs task.kind file (got {t.kind!r})")
        return found
