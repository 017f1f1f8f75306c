"""The values a run config refuses: anything that would do nothing, hang or divide by zero.

What: `value_problems(cfg)` lists, one message per problem, every value of a built `Config`
that cannot work, each message naming its dotted key; `Config.validate` raises them all at once
(__init__.py), so `rlvr train` stops before any process starts. `RENAMED_VALUES` are old
spellings of a value that a user's YAML may still hold: they are refused naming the new one.
Why a module of its own: the checks span sections (weight_sync against the staleness bound,
hora against rollout), and the package's __init__.py stays the schema.

Every function takes the run's `protocol.config.Config` as `cfg`, untyped here: the package's
__init__.py imports this module, and this one does not import it back.

Run the tests with: .venv/bin/python -m pytest tests/test_config_checks.py
"""

from __future__ import annotations

import math
import re

# dotted key -> {old value: new value}; refused with a message naming the new value
RENAMED_VALUES: dict[str, dict[str, str]] = {
    "rollout.policy": {"staged": "stop_on_correct"},  # beside `mode: staged` (Mu-GRPO) it misled
}


def renamed_value_problems(data: dict, overrides) -> list[str]:
    """Messages for old spellings in effect: the last `a.b=value` override of a key, else its
    value in the YAML `data` (nested dicts). An override with the new value fixes an old file."""
    import yaml

    found = []
    for key, renames in RENAMED_VALUES.items():
        value = data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        for text in overrides:
            k, eq, raw = text.partition("=")
            if eq and k.strip() == key:
                try:
                    value = yaml.safe_load(raw)
                except yaml.YAMLError:
                    pass  # the loader reports the bad override
        if isinstance(value, str) and value in renames:
            found.append(f"'{key}': {value!r} was renamed {renames[value]!r}; write "
                         f"{key}: {renames[value]}")
    return found


def _positive(found: list[str], values: dict[str, float], what: str = "> 0") -> None:
    for key, value in values.items():
        bad = value is None or (value <= 0 if what == "> 0" else value < 0)
        if bad or (isinstance(value, float) and not math.isfinite(value)):
            found.append(f"'{key}' must be {what}, got {value}")


def value_problems(cfg) -> list[str]:
    """Every value of `cfg` that would do nothing, hang or divide by zero (messages name keys)."""
    found: list[str] = []
    r, run, t, a, ws = cfg.rollout, cfg.run, cfg.task, cfg.actors, cfg.weight_sync
    _positive(found, {
        "run.eval_every": run.eval_every,  # step % eval_every
        "run.keep_checkpoints": run.keep_checkpoints,
        "rollout.prompts_per_step": r.prompts_per_step,
        "rollout.prompts_per_work": cfg.work_size,
        "rollout.max_new_tokens": r.max_new_tokens,
        "task.eval_samples": t.eval_samples,  # avg@k divides by k
        "actors.threads": a.threads, "actors.max_batch": a.max_batch,
        "actors.heartbeat_s": a.heartbeat_s, "actors.start_timeout_s": a.start_timeout_s,
        "actors.verifier_timeout_s": a.verifier_timeout_s,
        "learner.threads": cfg.learner.threads, "learner.micro_batch": cfg.learner.micro_batch,
        "weight_sync.timeout_s": ws.timeout_s, "weight_sync.bucket_mb": ws.bucket_mb,
        "warm_start.batch_size": cfg.warm_start.batch_size, "warm_start.lr": cfg.warm_start.lr,
        "optim.lr": cfg.optim.lr,
        "model.hidden": cfg.model.hidden, "model.layers": cfg.model.layers,
        "model.heads": cfg.model.heads, "model.ffn": cfg.model.ffn,
    })
    _positive(found, {"run.checkpoint_every": run.checkpoint_every,
                      "warm_start.steps": cfg.warm_start.steps,
                      "optim.warmup_steps": cfg.optim.warmup_steps,
                      "optim.weight_decay": cfg.optim.weight_decay,
                      "optim.grad_clip": cfg.optim.grad_clip}, ">= 0")
    for problems in (_sampling_problems, _model_problems, _warm_start_problems, _actor_problems,
                     _shape_problems, _task_problems, _loss_problems, _weight_sync_problems,
                     _update_problems, _staleness_problems):
        found += problems(cfg)
    return found


def _sampling_problems(cfg) -> list[str]:
    """Sampling: the behaviour log-probs and the learner's policy must be one distribution."""
    found: list[str] = []
    r = cfg.rollout
    if not r.temperature > 0:
        found.append(f"'rollout.temperature' must be > 0, got {r.temperature}: the policy is "
                     "softmax(logits / temperature); greedy decoding has no log-probs to train on")
    if r.top_p != 1.0:
        found.append(
            f"'rollout.top_p' must be 1.0 for training, got {r.top_p}: the learner's policy is the "
            "full softmax, while under top-p the tokens come from the renormalised nucleus, and "
            "the engines disagree on which log-prob they report (HF: before top-p, vLLM: after), "
            "so the importance ratios would be wrong in one engine or the other")
    if r.abort_on_first_correct and (r.policy == "fixed"
                                     or (r.policy == "hora" and not cfg.hora.two_phase)):
        found.append(f"'rollout.abort_on_first_correct' does nothing with rollout.policy "
                     f"{r.policy!r}{' (one phase)' if r.policy == 'hora' else ''}: only stages "
                     "that stop at a correct answer (stop_on_correct, aero's rescue rounds, "
                     "hora.two_phase's second phase) have samples to abort")
    return found


def _model_problems(cfg) -> list[str]:
    """The model's shape and device, and the optimizer's ZeRO stage."""
    found: list[str] = []
    r = cfg.rollout
    if cfg.model.heads > 0 and cfg.model.hidden % cfg.model.heads:
        found.append(f"'model.hidden' ({cfg.model.hidden}) must be a multiple of 'model.heads' "
                     f"({cfg.model.heads})")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", cfg.model.device):
        found.append(f"'model.device' must be cpu, cuda or cuda:N, got {cfg.model.device!r}")
    if cfg.weight_sync.backend == "nccl" and not cfg.model.device.startswith("cuda"):
        found.append("'weight_sync.backend' nccl needs the model on CUDA (model.device cuda), "
                     f"got {cfg.model.device!r}: NCCL broadcasts between GPUs")
    if not 0 <= cfg.optim.zero_stage <= 3:
        found.append(f"'optim.zero_stage' must be 0, 1, 2 or 3, got {cfg.optim.zero_stage}")
    if not cfg.model.path and cfg.model.max_positions <= r.max_new_tokens:
        found.append(f"'model.max_positions' ({cfg.model.max_positions}) must exceed "
                     f"'rollout.max_new_tokens' ({r.max_new_tokens}): the tiny model's "
                     "positions hold prompt + response")
    return found


def _warm_start_problems(cfg) -> list[str]:
    """The warm start's batch and label noise."""
    found: list[str] = []
    if cfg.warm_start.micro_batch is not None and cfg.warm_start.micro_batch < 1:
        found.append(f"'warm_start.micro_batch' must be >= 1 (rows per pass) or null, got "
                     f"{cfg.warm_start.micro_batch}")
    if not 0 <= cfg.warm_start.label_noise <= 1:
        found.append(f"'warm_start.label_noise' must be in [0, 1], got "
                     f"{cfg.warm_start.label_noise}")
    return found


def _actor_problems(cfg) -> list[str]:
    """The actors' engine memory and length, where evaluation runs, determinism, ports."""
    found: list[str] = []
    r, run, a = cfg.rollout, cfg.run, cfg.actors
    if not 0 < a.gpu_memory_utilization <= 1:
        found.append(f"'actors.gpu_memory_utilization' must be in (0, 1], got "
                     f"{a.gpu_memory_utilization}")
    if a.max_model_len is not None and a.max_model_len <= r.max_new_tokens:
        found.append(f"'actors.max_model_len' ({a.max_model_len}) must exceed "
                     f"'rollout.max_new_tokens' ({r.max_new_tokens}): it bounds prompt + response")
    if a.kv_cache_gib is not None and a.kv_cache_gib <= 0:
        found.append(f"'actors.kv_cache_gib' must be > 0 GiB (or null), got {a.kv_cache_gib}")
    if a.engine == "vllm" and cfg.model.device == "cpu" and a.kv_cache_gib is None:
        found.append("'actors.kv_cache_gib' is required with actors.engine=vllm on CPU (vLLM "
                     "would otherwise reserve actors.gpu_memory_utilization of all RAM for each "
                     "actor's KV cache); e.g. actors.kv_cache_gib=1")
    if run.eval_on == "actors" and a.engine != "hf":
        found.append(f"'run.eval_on' actors needs actors.engine hf, got {a.engine!r}: an actor "
                     "evaluates on a snapshot of the weights beside its training rows, and only "
                     "the HF engine's model can be copied so (use run.eval_on=learner)")
    if run.deterministic and (cfg.mode != "sync" or a.engine != "hf" or run.eval_on != "learner"):
        found.append(f"'run.deterministic' needs mode sync, actors.engine hf and run.eval_on "
                     f"learner, got {cfg.mode}, {a.engine}, {run.eval_on}: an asynchronous "
                     "schedule follows the processes' timing, vLLM schedules its own batches, and "
                     "an evaluation on the actors draws from their sampler between training rows")
    for key in ("zmq_port", "weights_port", "master_port"):
        if not 0 <= getattr(cfg.net, key) <= 65535:
            found.append(f"'net.{key}' must be a port in 0..65535 (0 = pick one), got "
                         f"{getattr(cfg.net, key)}")
    return found


def _staleness_problems(cfg) -> list[str]:
    """The injected delay and the downweight of stale groups."""
    found: list[str] = []
    if cfg.stale_inject < 0:
        found.append(f"'stale_inject' must be >= 0 (0 = off), got {cfg.stale_inject}")
    if cfg.stale_inject and cfg.mode == "staged":
        found.append(f"'stale_inject' ({cfg.stale_inject}) is refused in mode staged: a Mu-GRPO "
                     "stage already fixes each update's staleness (update u trains on data u "
                     "versions old); inject into mode sync or async")
    if not 0 < cfg.stale_downweight < 1:
        found.append(f"'stale_downweight' must be in (0, 1), got {cfg.stale_downweight} (1 is "
                     "stale_policy tis without a weight, 0 is drop)")
    return found


def _shape_problems(cfg) -> list[str]:
    """Counts and sizes the run's shape needs: steps, actors, ranks, groups, heartbeats."""
    found = []
    if cfg.run.steps < 1:
        found.append("run.steps must be >= 1")
    if cfg.max_staleness < 0:
        found.append("max_staleness must be >= 0")
    if cfg.rollout.group_size < 2:
        found.append("rollout.group_size must be >= 2 (a group needs a baseline)")
    if cfg.task.kind == "arithmetic" and len(cfg.task.levels) != len(cfg.task.level_weights):
        found.append("task.level_weights must have one weight per entry of task.levels")
    ws = cfg.warm_start.level_weights
    if ws is not None and len(ws) != len(cfg.task.levels):
        found.append("warm_start.level_weights must have one weight per entry of task.levels")
    if cfg.task.kind == "file" and not cfg.task.train_path:
        found.append("task.train_path is required when task.kind is 'file'")
    if cfg.warm_start.source == "task" and cfg.task.kind != "file":
        found.append("'warm_start.source' task warm-starts the embedded tiny model on a file task's "
                     f"solutions: it needs task.kind file (got {cfg.task.kind!r})")
    if cfg.actors.count < 1:
        found.append("actors.count must be >= 1")
    if cfg.learner.ranks < 1:
        found.append("learner.ranks must be >= 1")
    if cfg.learner.ranks > 1 and cfg.optim.zero_stage == 3:
        found.append("learner.ranks > 1 with optim.zero_stage 3 is not supported: evaluation and "
                     "weight publishing run on rank 0 alone, which needs every parameter whole "
                     "there (use ZeRO stage 0-2)")
    if cfg.actors.heartbeat_timeout_s <= cfg.actors.heartbeat_s:
        found.append("actors.heartbeat_timeout_s must exceed actors.heartbeat_s")
    if cfg.actors.max_restarts < 0:
        found.append("actors.max_restarts must be >= 0")
    found += _abort_limit_problems(cfg)
    if cfg.rollout.policy == "hora" and cfg.rollout.group_size < cfg.hora.k_min:
        found.append("rollout.group_size must be >= hora.k_min (the per-prompt budget must give "
                     "every prompt k_min responses)")
    return found


def _abort_limit_problems(cfg) -> list[str]:
    """abort_limit bounds how often `abort` restarts one sample: 0 would be `continue` by another
    name, and under another in-flight policy nothing is aborted at a sync."""
    from protocol.config.sections import ActorsConfig

    limit, policy = cfg.actors.abort_limit, cfg.actors.inflight_update
    if limit < 1:
        return [f"'actors.abort_limit' must be >= 1, got {limit} (a sample never aborted is "
                "actors.inflight_update continue)"]
    if policy != "abort" and limit != ActorsConfig.abort_limit:
        return [f"'actors.abort_limit' ({limit}) acts only under actors.inflight_update abort "
                f"(got {policy}): nothing is aborted at a sync otherwise"]
    return []


def _task_problems(cfg) -> list[str]:
    t, found = cfg.task, []
    if t.kind != "arithmetic":
        return found
    if not t.levels or min(t.levels) < 1:
        found.append(f"'task.levels' must be a non-empty list of digit counts >= 1, got "
                     f"{list(t.levels)}")
    weights = {"task.level_weights": t.level_weights}
    if cfg.warm_start.level_weights is not None:
        weights["warm_start.level_weights"] = cfg.warm_start.level_weights
    for key, w in weights.items():
        if any(x < 0 for x in w) or not sum(w) > 0:
            found.append(f"'{key}' must be >= 0 with a positive sum, got {list(w)}")
    if t.response_format == "worked" and "*" in t.ops:
        found.append(f"'task.response_format' worked is for '+' and '-' only, but 'task.ops' is "
                     f"{list(t.ops)}")
    if t.eval_per_level < 1:
        found.append(f"'task.eval_per_level' must be >= 1 (the held-out set would be empty), got "
                     f"{t.eval_per_level}")
    return found


def _loss_problems(cfg) -> list[str]:
    loss, found = cfg.loss, []
    if not 0 <= loss.clip_low <= 1 or loss.clip_high < 0:
        found.append(f"'loss.clip_low' must be in [0, 1] and 'loss.clip_high' >= 0, got "
                     f"{loss.clip_low} and {loss.clip_high}")
    if loss.dual_clip is not None and not loss.dual_clip > 1:
        found.append(f"'loss.dual_clip' must be > 1 or null, got {loss.dual_clip}")
    if not loss.behav_weight_cap > 0:
        found.append(f"'loss.behav_weight_cap' must be > 0, got {loss.behav_weight_cap}")
    if not loss.m2po_tau > 0:
        found.append(f"'loss.m2po_tau' must be > 0, got {loss.m2po_tau} (0 would mask every "
                     "trust-region token)")
    if loss.trust_region == "m2po" and loss.old_policy != "behaviour":
        found.append("'loss.trust_region' m2po needs loss.old_policy behaviour (got "
                     f"{loss.old_policy}): M2PO bounds the ratio to the policy that sampled the "
                     "data, with no proximal policy and no behaviour weight")
    return found


def _weight_sync_problems(cfg) -> list[str]:
    """sync_every against the schedule: 0 divides by zero; in sync mode anything but 1 makes
    every group stale (the actors sample with older weights than the learner trains); in async
    mode admission counts the actors' weights, which lag up to sync_every - 1 versions behind
    the learner, so a period above max_staleness + 1 leaves the step before a sync with groups
    that admission never hands out (docs/ALGORITHMS.md 8.2); in staged mode weights move only
    between stages, so the key does nothing."""
    k, found = cfg.weight_sync.sync_every, []
    if k < 1:
        return [f"'weight_sync.sync_every' must be >= 1, got {k}"]
    match cfg.mode:
        case "sync" if k != 1:
            found.append(f"'weight_sync.sync_every' must be 1 in mode sync (got {k}): the actors "
                         "would sample with weights older than the learner's, so no group is "
                         "ever on-policy")
        case "staged" if k != 1:
            found.append(f"'weight_sync.sync_every' does nothing in mode staged (got {k}): weights "
                         "move to the actors only between stages (mugrpo.updates_per_stage)")
        case "async" if k > cfg.max_staleness + 1:
            found.append(
                f"'weight_sync.sync_every' ({k}) must be <= max_staleness + 1 "
                f"({cfg.max_staleness + 1}): admission counts the actors' weights, which are "
                f"up to {k - 1} versions behind the learner's before a sync, so the learner "
                "would wait for groups that the staleness bound never lets out (raise "
                "max_staleness, or sync more often)")
    return found


def config_warnings(cfg) -> list[str]:
    """Settings that work but bias the data, said at the start of a run (launcher and learner):
    under `drop` or `downweight` the groups that outlive the bound are the long answers and the
    late stages (AR3PO's second stage, AERO's rescue rounds, HORA's second phase), the hard
    prompts, so the consumption rule filters (or discounts) by length and difficulty; `tis`
    without a behaviour weight trains those groups uncorrected."""
    if cfg.mode != "async":
        return []
    if cfg.stale_policy == "tis":
        if cfg.loss.behav_weight_mode != "off":
            return []
        return ["stale_policy 'tis' trains groups staler than max_staleness "
                f"({cfg.max_staleness}) relying on the behaviour weight, which "
                "loss.behav_weight_mode 'off' turns off: they are trained uncorrected"]
    verb, shown = {"drop": ("dropped", "stale/dropped_len_p90 and stale/dropped_stage_mean"),
                   "downweight": ("down-weighted", "stale/over_bound_groups")}[cfg.stale_policy]
    return [f"stale_policy '{cfg.stale_policy}': groups that come back staler than "
            f"max_staleness ({cfg.max_staleness}) are {verb}, and those are the long answers and "
            "the late sampling stages (the hard prompts): a filter by length and difficulty. "
            f"See {shown} against resp/len_generated_p90 and groups/later_stage_frac; the "
            "default 'tis' trains every group under the truncated importance weight"]


def _update_problems(cfg) -> list[str]:
    """The learner update's keys: optimizer steps, micro-batches and the KL term."""
    from protocol.config.sections import OptimConfig

    o, ln, found = cfg.optim, cfg.learner, []
    if o.mini_batches < 1:
        found.append(f"'optim.mini_batches' must be >= 1 (optimizer steps per learner step), "
                     f"got {o.mini_batches}")
    if o.epochs < 1:
        found.append(f"'optim.epochs' must be >= 1 (passes over a learner step's batch), got "
                     f"{o.epochs}")
    if o.group_order != OptimConfig.group_order and o.mini_batches == 1:
        found.append(f"'optim.group_order' ({o.group_order}) acts only with optim.mini_batches "
                     "> 1: one mini-batch holds every group, in any order")
    if o.mini_batches > cfg.rollout.prompts_per_step:
        found.append(f"'optim.mini_batches' ({o.mini_batches}) must be <= "
                     f"'rollout.prompts_per_step' ({cfg.rollout.prompts_per_step}): a mini-batch "
                     "holds whole groups, at least one")
    budget = ln.max_tokens_per_micro_batch
    if budget is not None and budget <= cfg.rollout.max_new_tokens:
        found.append(f"'learner.max_tokens_per_micro_batch' ({budget}) must exceed "
                     f"'rollout.max_new_tokens' ({cfg.rollout.max_new_tokens}): it is smaller "
                     "than one full-length sequence (prompt + response)")
    if cfg.loss.kl_beta < 0:
        found.append(f"'loss.kl_beta' must be >= 0 (0 = no KL term), got {cfg.loss.kl_beta}")
    return found
