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
the old weights, and decode on under the new ones (as PipelineRL does); vLLM refuses to reset its
prefix cache while requests hold blocks, so a request started just after such an update can
also reuse prompt blocks the old weights computed. Under `finish` and `abort` nothing runs at
an update and the prefix cache is reset.

Facts about vLLM 0.32 this relies on (read in vllm/v1/engine/llm_engine.py and
vllm/sampling_params.py, checked by tests/test_vllm_step.py on the real vLLM):
- `LLMEngine.add_request(request_id: str, {"prompt_token_ids": [...]}, SamplingParams)`,
  `step() -> list[RequestOutput]`, `abort_request([ids])`, `has_unfinished_requests()`.
- `SamplingParams(output_kind=RequestOutputKind.DELTA)`: each RequestOutput carries only the
  tokens (and log-probs) produced since the last one; `RequestOutput.finished` marks the end.
- A stop token (`stop_token_ids`, the eos) is kept as the last output token, as HFEngine keeps
  its eos.
The engine is not told to hold queued requests back (`step(admit=False)`): vLLM schedules every
request it has been given, so the actor itself holds new requests while a `finish` sync waits
(actors/stream.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from actors.engines import Aborted, Finished, extend_version_runs, generate_all


@dataclass
class _Request:
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_runs: list[tuple[int, int]] = field(default_factory=list)
    compute_s: float = 0.0

    def extend(self, token_ids, logprobs, version: int) -> None:
        """Append one step's new tokens (vLLM's delta output) and their sampled log-probs."""
        from actors.engines.vllm import sampled_logprob

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

    def _step_state(self) -> dict[int, _Request]:
        if not hasattr(self, "_requests"):
            self._requests: dict[int, _Request] = {}
        return self._requests

    def add(self, request_id: int, prompt_token_ids: list[int], max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0) -> None:
        from vllm.sampling_params import RequestOutputKind

        from actors.engines.vllm import build_requests

        requests = self._step_state()
        if request_id in requests:
            raise ValueError(f"request {request_id} is already in the engine")
        ((prompt, kw),) = build_requests([prompt_token_ids], [1], max_new_tokens, temperature,
                                         top_p, self.eos_token_ids)
        params = self._SamplingParams(**kw, output_kind=RequestOutputKind.DELTA)
        self._llm.llm_engine.add_request(str(request_id), prompt, params)
        requests[request_id] = _Request(max_new_tokens)

    def step(self, admit: bool = True) -> list[Finished]:
        requests = self._step_state()
        if not requests:
            return []
        t0 = time.perf_counter()
        outputs = self._llm.llm_engine.step()
        share = (time.perf_counter() - t0) / max(len(outputs), 1)
        done = []
        eos = set(self.eos_token_ids)
        for out in outputs:
            rid = int(out.request_id)
            r = requests.get(rid)
            if r is None:  # aborted meanwhile
                continue
            c = out.outputs[0]
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
        if gone:
            self._llm.llm_engine.abort_request([str(rid) for rid in gone])
        return [Aborted(rid, len(requests[rid].tokens), requests.pop(rid).compute_s)
                for rid in gone]

    def running(self) -> list[int]:
        """Requests that have produced a token (vLLM starts the others at its next step)."""
        return [rid for rid, r in self._step_state().items() if r.tokens]

    def unfinished(self) -> int:
        return len(self._step_state())

    def commit_weights(self) -> None:
        self._reload_weights()
        # the prefix cache holds KV blocks of the old weights; with requests running (continue)
        # vLLM keeps them, and the running requests decode on over their old blocks
        if not self._llm.reset_prefix_cache() and not self._step_state():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update "
                               "with no request of ours running")

    def generate(self, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0):
        return generate_all(self, prompts, n, max_new_tokens, temperature, top_p)


def _cut_runs(runs: list[tuple[int, int]], tokens: int) -> list[tuple[int, int]]:
    """The (version, tokens) runs covering the first `tokens` tokens."""
    out, left = [], tokens
    for version, n in runs:
        if left <= 0:
            break
        out.append((version, min(n, left)))
        left -= n
    return out
