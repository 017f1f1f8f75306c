"""vLLM generation engine (GPU production path), behind the same Protocol as `hf.HFEngine`.

What: batched sampling with vLLM's offline `LLM` (V1 engine, prefix caching on, so a prompt's
later AR3PO stages and AERO rescue rounds reuse its KV blocks), returning for every sampled token
its behaviour log-prob; and weight updates from the learner's broadcast.

Why this shape: everything that can be checked without a GPU lives in pure helpers below
(`engine_kwargs`, `build_requests`, `completion_from_output`, `staging_specs`,
`hf_to_vllm_names`), tested on CPU in tests/test_vllm_engine.py. `VLLMEngine` is the thin rest;
vLLM is imported only inside its `__init__`, so this module imports on machines without vLLM.

How weights arrive: `protocol.weights.WeightGroup.receive` writes the learner's tensors into
`weight_targets()`, staging tensors shaped like the Hugging Face model's `named_parameters()`
(vLLM fuses q/k/v and gate/up, so its own parameters cannot be the targets). `commit_weights()`
then hands `[(name, tensor)]` to vLLM's model `load_weights`, which copies (and fuses) them into
the live parameters in place, and resets the prefix cache, whose KV blocks the old weights made.
The staging copy costs one model's worth of GPU memory outside `gpu_memory_utilization`.

Facts about vLLM this relies on (read in vllm-project/vllm, V1 engine, 0.10.2 or newer):
- `LLM(logprobs_mode="processed_logprobs")` returns log-probs after temperature and top-k/top-p
  (vllm/config/model.py `logprobs_mode`; vllm/v1/sample/ops/topk_topp_sampler.py
  `forward_native`), i.e. of the distribution the token was drawn from. The default
  "raw_logprobs" is before temperature: wrong for the PPO ratio whenever temperature != 1.
  With top_p < 1 this is the renormalised nucleus distribution (HFEngine reports the pre-top-p
  one; both agree at top_p = 1).
- `SamplingParams(logprobs=0)` returns the sampled token's log-prob only: the sampler always
  gathers the sampled token next to the top-k (vllm/v1/sample/sampler.py `gather_logprobs(...,
  token_ids=sampled)`). `CompletionOutput.logprobs[t]` is `{token_id: Logprob(logprob=...)}`
  (vllm/logprobs.py; `FlatLogprobs` behaves as the same list of dicts).
- With `VLLM_ENABLE_V1_MULTIPROCESSING=0` the engine core runs in this process
  (vllm/v1/engine/llm_engine.py, `InprocClient`), so `LLM.collective_rpc(fn, args=...)` calls
  `fn(worker, *args)` directly and the staging tensors are passed by reference, not serialised.
- Qwen2/Llama `load_weights` take Hugging Face checkpoint names and fuse q/k/v and gate/up
  themselves (vllm/model_executor/models/qwen2.py: `stacked_params_mapping` in
  `Qwen2Model.load_weights`; `Qwen2ForCausalLM.load_weights` skips `lm_head.` when embeddings are
  tied). The same per-tensor `load_weights(weights=[(name, tensor)])` call is what vLLM's RLHF
  example uses (examples/offline_inference/rlhf_utils.py, `WorkerExtension.update_weight`).

    engine = VLLMEngine("Qwen/Qwen2.5-7B", gpu_memory_utilization=0.5)
    groups = engine.generate([[151644, 872, ...]], n=[8], max_new_tokens=1536)
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from actors.engines import Completion
from actors.engines.vllm_step import VLLMStepLoop

INSTALL_HINT = "vLLM is not installed; install with pip install -e '.[vllm]' on a GPU machine"


# -- pure helpers (no vLLM) ---------------------------------------------------------------------

def engine_kwargs(model_path: str, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.5,
                  enable_prefix_caching: bool = True, max_model_len: int | None = None,
                  seed: int = 0, enforce_eager: bool = False) -> dict:
    """Keyword arguments for `vllm.LLM`: one GPU, sampling defaults from vLLM rather than the
    checkpoint's generation_config (whose top_k/top_p/repetition_penalty would silently change
    the behaviour policy), log-probs of the distribution actually sampled."""
    kw = dict(model=model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
              enable_prefix_caching=enable_prefix_caching, seed=seed,
              enforce_eager=enforce_eager,  # True: no CUDA graphs (faster start, slower decode)
              tensor_parallel_size=1, generation_config="vllm",
              logprobs_mode="processed_logprobs")
    if max_model_len is not None:
        kw["max_model_len"] = max_model_len
    return kw


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


def staging_specs(model_path: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the Hugging Face model's `named_parameters()`, in order, built on the
    meta device from the config alone (no weights are read or allocated). Tied embeddings appear
    once, as `model.embed_tokens.weight`: `named_parameters` drops the tied `lm_head.weight`,
    exactly as it does on the learner, so the broadcast headers match."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def allocate_staging(specs: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype,
                     device: str | torch.device) -> list[tuple[str, torch.Tensor]]:
    """Uninitialised receive buffers, one per parameter (the broadcast overwrites every byte)."""
    return [(name, torch.empty(shape, dtype=dtype, device=device)) for name, shape in specs]


def hf_to_vllm_names(names: list[str]) -> list[str]:
    """Names vLLM's `load_weights` expects for these Hugging Face parameter names: the same ones
    for Qwen2/Llama (checkpoint names in, q/k/v and gate/up fused inside vLLM; see the module
    docstring for the file read). Kept as a seam for architectures that need renaming."""
    return list(names)


# -- the engine (thin: every vLLM call is here) -------------------------------------------------

class VLLMEngine(VLLMStepLoop):
    """Batch `generate` here; the step-level requests the actor uses come from VLLMStepLoop."""

    def __init__(self, model_path: str, device: str = "cuda", dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.5, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, seed: int = 0, enforce_eager: bool = False,
                 eos_token_id: int | list[int] | None = None):
        try:
            import vllm
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        # In-process engine core: collective_rpc then passes the staging tensors by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._SamplingParams = vllm.SamplingParams
        self._llm = vllm.LLM(**engine_kwargs(model_path, dtype, gpu_memory_utilization,
                                             enable_prefix_caching, max_model_len, seed,
                                             enforce_eager))
        if eos_token_id is None:
            from transformers import GenerationConfig
            eos_token_id = GenerationConfig.from_pretrained(model_path).eos_token_id
        self.eos_token_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        # Staging after vLLM has sized its KV cache, so it does not eat into that budget.
        specs = staging_specs(model_path)
        self._staging = allocate_staging(specs, getattr(torch, dtype), device)
        self._vllm_names = hf_to_vllm_names([name for name, _ in specs])

    def generate(self, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[list[Completion]]:
        out: list[list[Completion]] = [[] for _ in prompts]
        rows = [i for i, k in enumerate(n) if k > 0]
        if not rows:
            return out
        requests = build_requests([prompts[i] for i in rows], [n[i] for i in rows],
                                  max_new_tokens, temperature, top_p, self.eos_token_ids)
        params = [self._SamplingParams(**kw) for _, kw in requests]
        results = self._llm.generate([p for p, _ in requests], params, use_tqdm=False)
        for i, result in zip(rows, results):  # LLM.generate keeps the input order
            out[i] = [completion_from_output(c.token_ids, c.logprobs, self.eos_token_ids,
                                             max_new_tokens) for c in result.outputs]
        return out

    def weight_targets(self) -> list[tuple[str, torch.Tensor]]:
        return list(self._staging)

    def _reload_weights(self) -> None:
        """Copy the staged tensors into the live model (VLLMStepLoop.commit_weights then resets
        the prefix cache when no request holds blocks)."""
        pairs = [(name, t) for name, (_, t) in zip(self._vllm_names, self._staging)]
        self._llm.collective_rpc(_load_weights, args=(pairs,))


def _load_weights(worker, pairs: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside vLLM's worker (this process): copy the staged tensors into the live model."""
    model = worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model
    model.load_weights(weights=pairs)
