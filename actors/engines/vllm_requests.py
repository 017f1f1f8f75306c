"""vLLM requests in and completions out: the sampling parameters a request carries (every knob
explicit) and the sampled token's log-prob read back from vLLM's per-position output. Pure
functions, no vLLM import: both the engine (actors/engines/vllm.py) and its step loop
(actors/engines/vllm_step.py) use them."""

from __future__ import annotations

from collections.abc import Sequence

from tasks.sampling import Completion


def build_requests(prompts: list[list[int]], n: list[int], max_new_tokens: int,
                   temperature: float = 1.0, top_p: float = 1.0,
                   eos_token_ids: Sequence[int] = ()) -> list[tuple[dict, dict]]:
    """One vLLM request per prompt: (TokensPrompt dict, SamplingParams keyword arguments).

    n[i] >= 1 (vLLM fans a request out into n samples sharing the prompt's KV blocks). Every
    sampling knob is explicit, so neither vLLM's nor the checkpoint's defaults can change the
    behaviour policy. No per-request seed: vLLM samples seeded requests row by row (slow); the
    engine-level seed gives reproducibility. logprobs=0: only the sampled token's log-prob."""
    if len(prompts) != len(n):
        raise ValueError(f"{len(prompts)} prompts but {len(n)} sample counts")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    requests = []
    for ids, k in zip(prompts, n):
        if k < 1:
            raise ValueError(f"every prompt needs n >= 1, got {k}")
        sampling = dict(n=k, temperature=temperature, top_p=top_p, top_k=-1, min_p=0.0,
                        repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                        max_tokens=max_new_tokens, logprobs=0, detokenize=False,
                        stop_token_ids=list(eos_token_ids))
        requests.append(({"prompt_token_ids": list(ids)}, sampling))
    return requests


def completion_from_output(token_ids: Sequence[int], logprobs, eos_token_ids: int | Sequence[int],
                           max_new_tokens: int) -> Completion:
    """A `Completion` from one vLLM `CompletionOutput`'s `token_ids` and `logprobs`.

    `logprobs[t]` is vLLM's per-position dict {token_id: Logprob} (or a plain float); the sampled
    token's entry is taken. Tokens after the first eos are dropped (the eos itself is kept, as in
    HFEngine); `truncated` means the response did not end with an eos."""
    eos = {eos_token_ids} if isinstance(eos_token_ids, int) else set(eos_token_ids)
    ids = [int(t) for t in token_ids]
    stop = next((t + 1 for t, tok in enumerate(ids) if tok in eos), len(ids))
    ids = ids[:stop]
    if len(ids) > max_new_tokens:
        raise ValueError(f"engine returned {len(ids)} tokens, more than max_new_tokens "
                         f"{max_new_tokens}")
    if ids and (logprobs is None or len(logprobs) < len(ids)):
        got = None if logprobs is None else len(logprobs)
        raise ValueError(f"need one log-prob per token ({len(ids)}), got {got}: request logprobs=0")
    token_logp = [sampled_logprob(logprobs[t], tok) for t, tok in enumerate(ids)]
    return Completion(ids, token_logp, truncated=not (ids and ids[-1] in eos))


def sampled_logprob(entry, token_id: int) -> float:
    """The sampled token's log-prob from one position: a float, or vLLM's {token_id: Logprob}."""
    if isinstance(entry, (int, float)):
        return float(entry)
    try:
        value = entry[token_id]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"sampled token {token_id} missing from the position's log-probs "
                         f"{entry!r}") from None
    return float(getattr(value, "logprob", value))
