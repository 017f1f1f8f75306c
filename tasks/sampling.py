"""What sampling gives back: a request's result with the behaviour log-prob of every token.

An engine (tasks/hf_engine.py, the actors' vLLM engines) decodes requests step by step; one
request is one sample. A request that ends is `Finished`, one stopped before its end `Aborted`;
`generate_all` runs a batch of requests to their ends and returns `Completion`s (evaluation,
`rlvr eval`, benchmarks).

Every token carries its behaviour log-prob under the distribution it was drawn from:
softmax(logits / temperature), before top-p (with the default top_p = 1 that is exactly the
sampling distribution), and the policy version of the weights that produced it, as runs of
(version, tokens): a response that crossed a weight update in `actors.inflight_update: continue`
has two runs or more.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Completion:
    """One sampled response: its tokens (eos included when it stopped), the behaviour log-prob
    of each token under the sampling distribution, and whether it hit `max_new_tokens`."""

    token_ids: list[int]
    logprobs: list[float]
    truncated: bool


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


def eos_ids(model) -> set[int]:
    """The token ids that end a response of `model` (its generation config: Qwen lists two)."""
    eos = model.generation_config.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}


def generate_all(engine, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[list[Completion]]:
    """n[i] completions of prompts[i] from `engine` (its `add`, `step` and `unfinished`), every
    request run to its end. Request ids 0.. are used: call it on an engine with nothing else in
    flight."""
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
