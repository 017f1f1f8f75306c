"""Hugging Face transformers generation engine (CPU, or one GPU).

Sampling is `tasks.sampling.HFSampler` (batched `model.generate` with the KV cache and the
behaviour log-prob of every token); this engine adds loading and weight updates: the learner's
broadcast writes straight into the model's parameters, so there is nothing to commit.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from tasks.sampling import HFSampler


class HFEngine(HFSampler):
    @classmethod
    def load(cls, model_path: str, device: str = "cpu", dtype: str = "float32",
             max_batch: int = 512) -> "HFEngine":
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        model = model.to(device).eval()
        model.requires_grad_(False)
        return cls(model, max_batch)

    def weight_targets(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.model.named_parameters())

    def commit_weights(self) -> None:
        pass  # the broadcast wrote straight into the parameters

    def close(self) -> None:
        pass  # nothing beyond memory
