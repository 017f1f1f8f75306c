"""vLLM's engine step loop behind the step-level engine Protocol (actors/engines/__init__.py).

What: one vLLM request per sample (`SamplingParams(n=1)`), added to the in-process `LLMEngine`
with `add_request`, decoded by `step()` (one scheduler step: a token for every running
request), stopped by `abort_request`. Outputs come as deltas (`RequestOutputKind.DELTA`), so a
step hands over only its new tokens and their log-probs; each is tagged with the policy version
of the weights in the engine at that step.

Why in-process and step by step: with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (set by VLLMEngine) the
engine core runs in the actor's process, so between two `step()` calls the actor can read its
messages, start and abort requests and load new weights (`reload_weights`). Under
`actors.inflight_update: continue` the running requests keep their KV blocks, computed under
the old weights, and decode on under the new ones (as PipelineRL does; every token is tagged with
the version that sampled it).

No request starts over KV of older weights: vLLM refuses to reset its prefix cache while
requests hold blocks (always, under steady `continue`), so every request carries a cache salt
naming the weights it was started under (`cache_salt`: blocks are shared only between requests of
the same salt), and at a weight update every request that has not produced a token yet (queued,
or part-way through its prompt's prefill) is taken out and started again under the new salt. A
sample's prompt KV is therefore always computed by the weights of its first token, the version
the staleness rules read. Refused resets are counted (`prefix_cache_resets_refused`).

`step(admit=False)` holds back what has not started: vLLM schedules every request it has been
given, so requests without a token are taken out of vLLM and put back at the next
`step(admit=True)`; a `finish` sync waits only for the requests that are decoding.

Facts about vLLM 0.32 this relies on (read in vllm/v1/engine/llm_engine.py,
vllm/sampling_params.py, vllm/inputs/engine.py and vllm/v1/core/block_pool.py, checked by
tests/test_vllm_step.py on the real vLLM):
- `LLMEngine.add_request(request_id: str, {"prompt_token_ids": [...], "cache_salt": str},
  SamplingParams)`, `step() -> list[RequestOutput]`, `abort_request([ids])`.
- `SamplingParams(output_kind=RequestOutputKind.DELTA)`: each RequestOutput carries only the
  tokens (and log-probs) produced since the last one; `RequestOutput.finished` marks the end.
- A stop token (`stop_token_ids`, the eos) is kept as the last output token, as HFEngine keeps
  its eos.
- `LLM.reset_prefix_cache()` returns False (and resets nothing) while any block is in use.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from actors.engines.vllm_requests import build_requests, sampled_logprob
from tasks.sampling import Aborted, Finished, extend_version_runs, generate_all


@dataclass
class _Request:
    max_new_tokens: int
    prompt: dict  # vLLM's TokensPrompt, without the salt (set each time it enters vLLM)
    params: object  # vllm.SamplingParams
    in_vllm: bool = False
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_runs: list[tuple[int, int]] = field(default_factory=list)
    compute_s: float = 0.0

    def extend(self, token_ids, logprobs, version: int) -> None:
        """Append one step's new tokens (vLLM's delta output) and their sampled log-probs."""
        n = len(token_ids)
        if len(logprobs or []) < n:
            raise ValueError(f"vLLM returned {n} tokens but {len(logprobs or [])} log-probs: "
                             "request logprobs=0")
        for tok, entry in zip(token_ids, logprobs):
            self.tokens.append(int(tok))
            self.logprobs.append(sampled_logprob(entry, int(tok)))
        extend_version_runs(self.version_runs, version, n)


class VLLMStepLoop:
    """Mixed into VLLMEngine: needs `self._llm` (vllm.LLM, in-process), `self._SamplingParams`,
    `self.eos_token_ids` and `self._reload_weights()` (the in-place update, no cache reset)."""

    policy_version: int = 0
    weights_loaded: int = 0  # weight updates committed: the cache salt of new requests
    prefix_cache_resets_refused: int = 0
    prompt_tokens_cached: int = 0  # prompt tokens whose KV came from the prefix cache, all told
    last_step_rows: int = 0

    def _step_state(self) -> dict[int, _Request]:
        if not hasattr(self, "_requests"):
            self._requests: dict[int, _Request] = {}
        return self._requests

    def add(self, request_id: int, prompt_token_ids: list[int], max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0) -> None:
        from vllm.sampling_params import RequestOutputKind

        requests = self._step_state()
        if request_id in requests:
            raise ValueError(f"request {request_id} is already in the engine")
        ((prompt, kw),) = build_requests([prompt_token_ids], [1], max_new_tokens, temperature,
                                         top_p, self.eos_token_ids)
        params = self._SamplingParams(**kw, output_kind=RequestOutputKind.DELTA)
        requests[request_id] = r = _Request(max_new_tokens, prompt, params)
        self._enter(request_id, r)

    def _enter(self, request_id: int, r: _Request) -> None:
        prompt = {**r.prompt, "cache_salt": f"weights-{self.weights_loaded}"}
        self._llm.llm_engine.add_request(str(request_id), prompt, r.params.clone())
        r.in_vllm = True

    def _take_out_unstarted(self) -> list[tuple[int, _Request]]:
        """Requests in vLLM without a token yet (queued, or part-way through prefill), taken
        out of it; nothing of theirs was sampled, so nothing is lost."""
        out = [(rid, r) for rid, r in self._step_state().items() if r.in_vllm and not r.tokens]
        if out:
            self._llm.llm_engine.abort_request([str(rid) for rid, _ in out])
        for _, r in out:
            r.in_vllm = False
        return out

    def step(self, admit: bool = True) -> list[Finished]:
        requests = self._step_state()
        if admit:  # what a hold took out goes back in
            for rid, r in requests.items():
                if not r.in_vllm:
                    self._enter(rid, r)
        else:
            self._take_out_unstarted()
        self.last_step_rows = 0
        if not any(r.in_vllm for r in requests.values()):
            return []
        t0 = time.perf_counter()
        outputs = self._llm.llm_engine.step()
        share = (time.perf_counter() - t0) / max(len(outputs), 1)
        done = []
        eos = set(self.eos_token_ids)
        for out in outputs:
            rid = int(out.request_id)
            r = requests.get(rid)
            if r is None or not r.in_vllm:  # aborted or taken out meanwhile
                continue
            c = out.outputs[0]
            self.last_step_rows += bool(c.token_ids)
            if c.token_ids and not r.tokens:  # its first token: the prefill is done
                self.prompt_tokens_cached += out.num_cached_tokens or 0
            r.extend(c.token_ids, c.logprobs, self.policy_version)
            r.compute_s += share
            if out.finished:
                del requests[rid]
                cut = next((t + 1 for t, tok in enumerate(r.tokens) if tok in eos), len(r.tokens))
                done.append(Finished(rid, r.tokens[:cut], r.logprobs[:cut],
                                     _cut_runs(r.version_runs, cut),
                                     truncated=not (cut and r.tokens[cut - 1] in eos),
                                     compute_s=r.compute_s))
        return done

    def abort(self, request_ids: Iterable[int]) -> list[Aborted]:
        requests = self._step_state()
        gone = [rid for rid in request_ids if rid in requests]
        in_vllm = [str(rid) for rid in gone if requests[rid].in_vllm]
        if in_vllm:
            self._llm.llm_engine.abort_request(in_vllm)
        return [_aborted(rid, requests.pop(rid)) for rid in gone]

    def running(self) -> list[int]:
        """Requests decoding (a token sampled). The ones in vLLM without a token yet need no
        waiting or aborting at a sync: a hold takes them out, a weight update starts them again
        under the new weights (`step`, `commit_weights`)."""
        return [rid for rid, r in self._step_state().items() if r.in_vllm and r.tokens]

    def unfinished(self) -> int:
        return len(self._step_state())

    @property
    def max_rows(self) -> int:
        return self._llm.llm_engine.vllm_config.scheduler_config.max_num_seqs

    def drop_prefix_cache(self) -> None:
        """Forget every cached prompt block, so the next prompts are prefilled from nothing (the
        decode probe times prefills, rlvr/plan/decode_probe.py). Only with no request in vLLM."""
        if any(r.in_vllm for r in self._step_state().values()) or \
                not self._llm.reset_prefix_cache():
            raise RuntimeError("drop_prefix_cache: requests hold blocks; call it on an empty engine")

    def commit_weights(self) -> None:
        self._reload_weights()
        self.weights_loaded += 1
        # requests that have not sampled a token start again under the new salt, so their
        # prompt KV comes from the weights of their first token (a partial prefill is redone)
        for rid, r in self._take_out_unstarted():
            self._enter(rid, r)
        if not self._llm.reset_prefix_cache():
            # blocks in use (requests running under `continue`): the old blocks stay cached, but
            # under the old salt, which no request entering from now on carries
            if not any(r.in_vllm and r.tokens for r in self._step_state().values()):
                raise RuntimeError("vLLM refused to reset its prefix cache after a weight update "
                                   "with no request of ours decoding")
            self.prefix_cache_resets_refused += 1

    def generate(self, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0):
        return generate_all(self, prompts, n, max_new_tokens, temperature, top_p)


def _aborted(rid: int, r: _Request) -> Aborted:
    return Aborted(rid, len(r.tokens), r.compute_s, tuple(r.tokens), tuple(r.logprobs),
                   tuple(r.version_runs))


def _cut_runs(runs: list[tuple[int, int]], tokens: int) -> list[tuple[int, int]]:
    """The (version, tokens) runs covering the first `tokens` tokens."""
    out, left = [], tokens
    for version, n in runs:
        if left <= 0:
            break
        out.append((version, min(n, left)))
        left -= n
    return out
