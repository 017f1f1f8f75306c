"""Sampling: `rollout:` (prompts per step and per work item, group size, length, temperature,
the rollout policy). The class holds its keys' meaning and their rules: `problems(cfg)`, the
values that cannot work, and `inert(cfg)`, the keys set where nothing reads them
(protocol/config/checks.py, inert.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.config.checks import positive


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 32
    """Groups (prompts) per learner step."""
    group_size: int = 8
    """Responses per prompt for fixed-N sampling (GRPO), HORA's mean budget per prompt. Unused
    by stop_on_correct (ar3po.stage_sizes) and aero (aero.n_*): another value is refused there."""
    max_new_tokens: int = 8
    """Generation cap per response."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold. Training needs 1.0: the learner's policy is the full softmax,
    and under top-p the engines report different behaviour log-probs (HF before the nucleus cut,
    vLLM after it), so any other value is refused."""
    prompts_per_work: int | None = 8
    """Prompts per work item handed to an actor; null = one step's prompts (prompts_per_step).
    Smaller items let weight syncs interleave sooner in async mode and spread a step over
    several actors, larger ones batch generation better. AERO's rescue budget and HORA's
    allocation are pooled over a work item, so their presets make it a whole step (null;
    docs/TRAINING.md, "Algorithms and schedules")."""
    policy: Literal["fixed", "stop_on_correct", "aero", "hora"] = "fixed"
    """Rollout policy: fixed = group_size responses per prompt (GRPO); stop_on_correct = AR3PO
    stages (ar3po.stage_sizes) that stop at a prompt's first correct response; aero = AERO
    explore then rescue rounds from a budget pooled over the work item (aero.*); hora = the
    actor allocates group_size x the work item's prompts responses by greedy hit utility under
    the learner's per-prompt posterior counts (hora.*)."""
    abort_on_first_correct: bool = False
    """In the stages that stop at a prompt's first correct response (every AR3PO stage, AERO's
    rescue rounds, HORA's second phase), abort the prompt's samples still decoding once one is
    verified correct (after at least 2 have finished, so the group keeps a baseline). The group
    is the finished samples; aborted partial responses count as generated (gen/aborted_tokens)
    and are never trained on. false = a stage runs all its samples."""

    def problems(self, cfg) -> list[str]:
        """Sizes; sampling: the behaviour log-probs and the learner's policy must be one
        distribution; the abort switch where nothing stops at a correct answer."""
        found = positive({"rollout.prompts_per_step": self.prompts_per_step,
                          "rollout.prompts_per_work": cfg.work_size,
                          "rollout.max_new_tokens": self.max_new_tokens})
        if self.group_size < 2:
            found.append("rollout.group_size must be >= 2 (a group needs a baseline)")
        if self.policy == "hora" and self.group_size < cfg.hora.k_min:
            found.append("rollout.group_size must be >= hora.k_min (the per-prompt budget must "
                         "give every prompt k_min responses)")
        if not self.temperature > 0:
            found.append(f"'rollout.temperature' must be > 0, got {self.temperature}: the policy "
                         "is softmax(logits / temperature); greedy decoding has no log-probs to "
                         "train on")
        if self.top_p != 1.0:
            found.append(
                f"'rollout.top_p' must be 1.0 for training, got {self.top_p}: the learner's "
                "policy is the full softmax, while under top-p the tokens come from the "
                "renormalised nucleus, and the engines disagree on which log-prob they report "
                "(HF: before top-p, vLLM: after), so the importance ratios would be wrong in one "
                "engine or the other")
        one_phase = self.policy == "hora" and not cfg.hora.two_phase
        if self.abort_on_first_correct and (self.policy == "fixed" or one_phase):
            found.append(f"'rollout.abort_on_first_correct' does nothing with rollout.policy "
                         f"{self.policy!r}{' (one phase)' if one_phase else ''}: only stages "
                         "that stop at a correct answer (stop_on_correct, aero's rescue rounds, "
                         "hora.two_phase's second phase) have samples to abort")
        return found

    def inert(self, cfg) -> list[tuple[str, str]]:
        """Work-item size under determinism, the group size of policies that spend their own."""
        found = []
        if cfg.run.deterministic and self.prompts_per_work != RolloutConfig.prompts_per_work:
            found.append(("rollout.prompts_per_work", f"'rollout.prompts_per_work' "
                          f"({self.prompts_per_work}) does nothing under run.deterministic: each "
                          "actor takes its share of a generation round in one work item "
                          f"({cfg.work_size} prompts)"))
        if (self.group_size != RolloutConfig.group_size
                and self.policy in ("stop_on_correct", "aero")):
            spends = "ar3po.stage_sizes" if self.policy == "stop_on_correct" else "aero.n_*"
            found.append(("rollout.group_size", f"'rollout.group_size' ({self.group_size}) is "
                          f"unused by rollout.policy {self.policy}, which spends {spends} per "
                          "prompt"))
        return found
