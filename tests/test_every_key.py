"""Every config key acts: it changes what the run computes, or a test that runs the processes
with the key set shows what it does, or its other values are refused where they cannot act.

A key that nothing reads does nothing whatever its value (`aero.negative_pick` and
`ar3po.buffer_pick` once were such keys). Three checks, over every field of `Config`:
- read: the code that runs reads the key by its whole chain (`cfg.optim.lr`, `r.top_p` after
  `r = cfg.rollout`), outside the value checks in protocol/config/checks.py and the config's
  own rules (`validate`, `problems`, `inert`): `warm_start.lr` read as `cfg.optim.lr` does not
  count;
- acts: a value other than the base config's changes a fingerprint of what a run computes,
  without starting its processes, and holds no copy of a config value: a learner step on a real
  DeepSpeed engine (metrics and exact weights), the coordinator's first hand-out and an actor's
  samples for it (real scheduler, HF engine and verifier), the warm start's model and first
  steps, the prompt stream, the held-out set, two steps of `build_step` on fixed groups. A part
  that raises fails the check (a value the config takes must run);
- pinned at run time: keys that act only inside running processes (ports, heartbeats, the
  number of actors, vLLM's engine, ...) name the test that runs with them set through the config
  as `key=value` and observes what they do.
Keys whose other values need a GPU (`ON_GPU`) or have no other working value (`ONE_VALUE`) must
refuse a bad value naming the key (tests/test_config_checks.py holds the other refusals).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import textwrap
import typing
from pathlib import Path

import pytest

from protocol.config import Config, ConfigError, load_config, to_dict, with_overrides

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny-cpu.yaml"
CODE = ("actors", "learner", "protocol", "rlvr", "tasks")
ONLY_CHECKS = {"protocol/config/checks.py"}
# the config's own rules beside each section's keys: a key read there is checked, not used
RULES = {"validate", "problems", "inert"}

# keys read only inside running processes -> the test that runs with the key set through the
# config (`key=value`) and observes what it does
AT_RUN_TIME = {
    "task.reward": "tests/test_reward_e2e.py::"
        "test_a_reward_function_of_the_users_trains_logs_its_scores_and_survives_its_errors",
    "run.steps": "tests/test_e2e.py::"
        "test_sync_mode_is_exactly_on_policy",
    "run.eval_every": "tests/test_e2e.py::"
        "test_sync_mode_is_exactly_on_policy",
    "run.deterministic": "tests/test_deterministic.py::"
        "test_a_sync_run_with_two_actors_repeats_bit_for_bit",
    "run.eval_on": "tests/test_actor_eval.py::"
        "test_actors_evaluate_what_the_learner_would_answer_for_answer",
    "run.checkpoint_every": "tests/test_faults.py::"
        "test_a_learner_killed_mid_run_resumes_losing_no_prompt_and_repeating_none",
    "run.keep_checkpoints": "tests/test_e2e.py::"
        "test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set",
    "run.wandb": "tests/test_e2e.py::"
        "test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set",
    "run.progress": "tests/test_e2e.py::"
        "test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set",
    "model.path": "tests/test_e2e.py::"
        "test_sync_mode_is_exactly_on_policy",
    "warm_start.cache_dir": "tests/test_warm_start.py::"
        "test_the_warm_start_command_refuses_no_threads_and_two_at_once_build_one_model",
    "task.eval_samples": "tests/test_eval.py::"
        "trained_run",
    "rollout.abort_on_first_correct": "tests/test_streaming_actor.py::"
        "test_siblings_of_a_first_correct_answer_stop_and_are_counted",
    "actors.count": "tests/test_faults.py::"
        "test_an_actor_killed_twice_is_restarted_and_the_run_finishes_with_no_group_twice",
    "actors.threads": "tests/test_e2e.py::"
        "test_async_mode_advances_actor_versions_within_the_staleness_bound",
    "learner.threads": "tests/test_e2e.py::"
        "test_async_mode_advances_actor_versions_within_the_staleness_bound",
    "actors.heartbeat_s": "tests/test_slurm_cluster.py::"
        "test_a_real_async_run_is_preempted_requeued_and_resumes_without_gaps",
    "actors.heartbeat_timeout_s": "tests/test_slurm_cluster.py::"
        "test_a_real_async_run_is_preempted_requeued_and_resumes_without_gaps",
    "actors.start_timeout_s": "tests/test_faults.py::"
        "test_a_learner_whose_actors_never_say_hello_gives_up_after_the_start_timeout",
    "weight_sync.timeout_s": "tests/test_slurm_cluster.py::"
        "test_a_real_async_run_is_preempted_requeued_and_resumes_without_gaps",
    "actors.max_restarts": "tests/test_faults.py::"
        "test_an_actor_killed_twice_is_restarted_and_the_run_finishes_with_no_group_twice",
    "actors.verifier_timeout_s": "tests/test_e2e.py::"
        "test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set",
    "actors.inflight_update": "tests/test_streaming_actor.py::"
        "test_a_sync_announced_in_the_middle_of_a_long_generation",
    "actors.abort_limit": "tests/test_streaming_actor.py::"
        "test_under_abort_a_sample_restarted_abort_limit_times_decodes_on_through_the_next_sync",
    "learner.ranks": "tests/test_learner_ranks.py::"
        "test_a_run_with_two_learner_ranks_trains_checkpoints_and_resumes",
    "learner.grad_checkpointing": "tests/test_learner_ranks.py::"
        "test_gradient_checkpointing_recomputes_the_same_gradient",
    "net.learner_host": "tests/test_slurm_roles.py::"
        "test_an_actor_gets_its_id_and_the_learner_address_but_no_rendezvous_env",
    "net.bind_host": "tests/test_slurm_roles.py::"
        "test_a_learner_rank_gets_the_rendezvous_env_and_binds_every_interface",
    "net.zmq_port": "tests/test_faults.py::"
        "test_a_learner_whose_port_is_taken_stops_the_run_with_one_line_naming_the_key",
    "net.weights_port": "tests/test_faults.py::"
        "test_a_learner_whose_port_is_taken_stops_the_run_with_one_line_naming_the_key",
    "net.master_port": "tests/test_faults.py::"
        "test_a_learner_whose_port_is_taken_stops_the_run_with_one_line_naming_the_key",
    "net.curve_dir": "tests/test_faults.py::"
        "test_a_key_folder_without_the_learners_keys_stops_the_run_with_one_line_naming_it",
    "weight_sync.sync_every": "tests/test_e2e.py::"
        "test_weights_published_every_other_step_keep_admission_within_the_bound",
    "weight_sync.bucket_mb": "tests/test_e2e.py::"
        "test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set",
    "dapo.max_gen_batches": "tests/test_algorithms_e2e.py::"
        "test_dapo_gives_up_filling_a_step_after_max_gen_batches",
    "run.name": "tests/test_e2e.py::"
        "test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set",
    "run.out_dir": "tests/test_e2e.py::"
        "test_a_run_keeps_its_folder_checkpoints_wandb_progress_syncs_and_verdicts_as_set",
    "optim.zero_stage": "tests/test_reference_zero3.py::"
        "test_a_zero3_reference_stays_partitioned_and_gives_the_initial_model_s_logprobs",
    "actors.engine": "tests/test_vllm_real.py::"
        "test_vllm_runs_with_the_engine_settings_the_config_set",
    "actors.gpu_memory_utilization": "tests/test_vllm_real.py::"
        "test_vllm_runs_with_the_engine_settings_the_config_set",
    "actors.kv_cache_gib": "tests/test_vllm_real.py::"
        "test_vllm_runs_with_the_engine_settings_the_config_set",
    "actors.enable_prefix_caching": "tests/test_vllm_real.py::"
        "test_vllm_runs_with_the_engine_settings_the_config_set",
    "actors.max_model_len": "tests/test_vllm_real.py::"
        "test_vllm_runs_with_the_engine_settings_the_config_set",
    "actors.enforce_eager": "tests/test_vllm_real.py::"
        "test_vllm_runs_with_the_engine_settings_the_config_set",
}

# keys with one working value: any other is refused (the value check names why)
ONE_VALUE = {"rollout.top_p": "rollout.top_p=0.9"}
# keys whose other values need a GPU: on this machine one value runs and a malformed one is
# refused (scripts/gpu_check.py runs the others)
ON_GPU = {"model.device": "model.device=gpu", "weight_sync.backend": "weight_sync.backend=nccl"}
# the overrides under which a key can act (elsewhere another value is refused or does nothing)
WHERE = {
    "stale_downweight": ["stale_policy=downweight"],
    "loss.kl_kind": ["loss.kl_beta=0.05"],
    "loss.trust_region": ["loss.old_policy=behaviour"],
    "loss.m2po_tau": ["loss.old_policy=behaviour", "loss.trust_region=m2po"],
    "gcpo.beta_c": ["algorithm=gcpo", "gcpo.form=logsigmoid"],
    "rollout.group_size": ["algorithm=grpo"],
    "ar3po.": ["algorithm=ar3po", "ar3po.reuse_mode=direct_replay", "ar3po.buffer_pick=uniform"],
    "aero.": ["algorithm=aero"], "hora.": ["algorithm=hora"], "dapo.": ["algorithm=dapo"],
    "mugrpo.": ["algorithm=mugrpo"], "gcpo.": ["algorithm=gcpo"],
    "model.lora.": ["model.lora.rank=2"],
    "warm_start.source": ["task.kind=file"],  # with the files the fixture writes
    "task.": ["task.kind=file"],  # with the files the fixture writes, but for:
}
ARITHMETIC = {"task.levels", "task.level_weights", "task.ops", "task.eval_per_level",
              "task.response_format", "task.kind"}
# alternative values the automatic choice (another literal, +1, x0.5, ...) would not find
ALTERNATIVES = {
    "task.levels": ["[1, 2, 4]"], "task.level_weights": ["[0.5, 0.3, 0.2]"],
    "warm_start.level_weights": ["[0.2, 0.8, 0.0]"], "task.ops": ['["+", "-"]'],
    "learner.max_tokens_per_micro_batch": ["12", "100"],  # the probe's rows are short
    "loss.dual_clip": ["1.5", "3"],  # few of the probe's ratios pass 3
    "model.lora.target_modules": ['["q_proj", "v_proj"]'],
}


def leaf_keys(cls: type = Config, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        factory = f.default_factory
        if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory):
            keys += leaf_keys(factory, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _sections(cls: type = Config, prefix: str = "") -> dict[str, str]:
    found = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            found[prefix + f.name] = f.default_factory.__name__
            found |= _sections(f.default_factory, f"{prefix}{f.name}.")
    return found


SECTIONS = _sections()
"""Config's sections by dotted path: "rollout" -> "RolloutConfig", "model.lora" ->
"LoraConfig"."""


def _section_of_annotation(annotation) -> str | None:
    """The section a parameter or field annotated `RolloutConfig`, `MuGRPOConfig | None` or
    "LossConfig" holds."""
    if annotation is None:
        return None
    text = annotation.value if isinstance(annotation, ast.Constant) else ast.unparse(annotation)
    names = {part.strip() for part in str(text).split("|")}
    return next((s for s, cls in SECTIONS.items() if cls in names), None)


def key_reads() -> set[str]:
    """Config keys read in the code that runs (not in the value checks nor the config's rules), by
    their full chain: `cfg.rollout.top_p`, `r.top_p` after `r = cfg.rollout` (or as a parameter
    `r: RolloutConfig`), `spec.veto.veto_delta` where a field `veto: MuGRPOConfig` holds a
    section; a top-level key as `<name>.algorithm` on anything but a section."""
    files = [p for folder in CODE for p in (ROOT / folder).rglob("*.py")
             if str(p.relative_to(ROOT)) not in ONLY_CHECKS]
    trees = [ast.parse(p.read_text()) for p in files]
    fields = {node.target.id: section for tree in trees for node in ast.walk(tree)
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and (section := _section_of_annotation(node.annotation))}
    fields.update({name: name for name in SECTIONS})  # cfg.rollout is the section rollout

    def section_of(node, alias: dict) -> str | None:
        if isinstance(node, ast.Attribute):
            return fields.get(node.attr)
        if isinstance(node, ast.Name):
            return alias.get(node.id)
        return None

    reads: set[str] = set()
    for tree in trees:
        skipped = {id(node) for fn in ast.walk(tree)
                   if isinstance(fn, ast.FunctionDef) and fn.name in RULES
                   for node in ast.walk(fn)}
        scopes = [tree, *(n for n in ast.walk(tree)
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
        for scope in scopes:
            alias: dict[str, str] = {}
            if not isinstance(scope, ast.Module):
                for arg in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs):
                    if section := _section_of_annotation(arg.annotation):
                        alias[arg.arg] = section
            for node in ast.walk(scope):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        pairs = ([(target, node.value)] if isinstance(target, ast.Name) else
                                 zip(target.elts, node.value.elts)
                                 if isinstance(target, ast.Tuple)
                                 and isinstance(node.value, ast.Tuple) else [])
                        for name, value in pairs:
                            if isinstance(name, ast.Name) and (s := section_of(value, {})):
                                alias[name.id] = s
            for node in ast.walk(scope):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                        and id(node) not in skipped):
                    section = section_of(node.value, alias)
                    reads.add(f"{section}.{node.attr}" if section else node.attr)
    return reads


def test_every_config_key_is_read_by_the_code_that_runs():
    keys = leaf_keys()
    assert len(keys) > 100 and "ar3po.buffer_pick" in keys  # the walk reaches every section
    reads = key_reads()
    # a section's key read on another section does not count: warm_start.steps is not run.steps
    assert "run.steps" in reads and "warm_start.lr" in reads and "optim.lr" in reads
    unread = [k for k in keys if k not in reads]
    assert unread == [], f"config keys nothing reads (make them act, or remove them): {unread}"


# -- acts: the fingerprint --------------------------------------------------------------------

@pytest.fixture(scope="module")
def task_files(tmp_path_factory) -> list[str]:
    """Two small file tasks whose alternative field names hold other values."""
    folder = tmp_path_factory.mktemp("tasks")
    paths = []
    for name, shift in (("train", 0), ("eval", 5)):
        rows = [{"prompt": f"{i + shift}+1=", "question": f"{i + shift}+2=",
                 "answer": str(i + shift + 1), "ans": str(i + shift + 2),
                 "solution": f"\\boxed{{{i + shift + 1}}}", "sol": "x"} for i in range(6)]
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(path))
    return [f"task.train_path={paths[0]}", f"task.eval_path={paths[1]}"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """What the fingerprint runs on: a 1-layer tiny model on disk, a process that holds a learner
    world of one rank for real DeepSpeed engines (DeepSpeed's state lives in its modules: in this
    process it would meet the worlds other tests made and unmade), the verifiers it starts."""
    import multiprocessing

    from rlvr.launch import free_port
    from tasks.tiny_model import build_tiny

    path = build_tiny(tmp_path_factory.mktemp("probe") / "model", hidden=16, layers=1, heads=2,
                      ffn=32, seed=0)
    ctx = multiprocessing.get_context("spawn")
    server, client = ctx.Pipe()
    proc = ctx.Process(target=update_server, args=(client, str(path), free_port()), daemon=True)
    proc.start()
    _PROBE.update(path=str(path), server=server, verifiers={}, memo={})
    yield
    for verifier in _PROBE["verifiers"].values():
        verifier.close()
    _PROBE.clear()
    server.send(None)
    proc.join(60)
    if proc.is_alive():
        proc.kill()


def update_server(conn, model_path: str, port: int) -> None:
    """Child process: a learner world of one rank (gloo); `probe_update` of each config it is
    sent, until None (an exception comes back as its text)."""
    from learner.engine import init_learner_distributed, leave_distributed

    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    os.environ.update(zip(names, ("127.0.0.1", str(port), "0", "0", "1")))
    init_learner_distributed(load_config(TINY, [f"model.path={model_path}"]), 0, 1)
    try:
        while (cfg := conn.recv()) is not None:
            try:
                conn.send(probe_update(cfg))
            except Exception as e:  # noqa: BLE001 - the parent's part raises it
                conn.send(RuntimeError(repr(e)))
    finally:
        leave_distributed()


def update_in_server(cfg: Config) -> tuple:
    _PROBE["server"].send(cfg)
    reply = _PROBE["server"].recv()
    if isinstance(reply, Exception):
        raise reply
    return reply


def fingerprint(cfg: Config) -> dict[str, str]:
    """What a run of `cfg` computes, part by part, without starting its processes: never a copy
    of a config value, only what the code makes of it. A part that raises fails the check."""
    from learner.data import PromptStream, held_out
    from learner.update import UpdateSpec
    from tasks.tiny_model import build_tokenizer

    tok = build_tokenizer()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=_PROBE["path"]))
    parts = {
        "update": lambda: memo(("update", UpdateSpec.of(cfg), cfg.optim, cfg.learner, cfg.model,
                                cfg.loss), lambda: update_in_server(cfg)),
        "generation": lambda: generation(cfg, tok),
        "warm_start": lambda: memo(("warm_start", cfg.model, cfg.warm_start, cfg.task,
                                    cfg.run.seed), lambda: warm_start_steps(cfg, tok)),
        "held_out": lambda: [(p.question, p.answer) for p in held_out(cfg)],
        "stream": lambda: [(p.prompt_token_ids, p.answer, p.n, s) for p, s in zip(
            PromptStream(cfg, tok, keep_solutions=True), range(24))],
        "solutions": lambda: first_solution(cfg, tok),
        "steps": lambda: two_steps(cfg),
    }
    out = {}
    for name, part in parts.items():
        try:
            out[name] = repr(part())
        except Exception as e:
            raise AssertionError(f"fingerprint part {name} raised {e!r}") from e
    return out


_PROBE: dict = {}


def memo(inputs, compute):
    """`compute()`, once per `inputs`: what a seeded part computes on one thread depends only on
    the config values it reads. `inputs` only keys the cache, never enters the print: a value
    left out of it could only make a key that acts look inert (and fail the check)."""
    key = repr(inputs)
    if key not in _PROBE["memo"]:
        _PROBE["memo"][key] = compute()
    return _PROBE["memo"][key]


def exact_hash(tensors) -> str:
    import hashlib

    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


PROBE_LR_SCALE = 500.0
"""The probe's learning rate over the config's: the tiny config's 2e-4 becomes AdamW's 0.1, so
four optimizer steps (two mini-batches, two epochs) move the 1-layer model far enough for the
clip terms to act (loss.dual_clip's and gcpo.eps_c's only from about there)."""


def probe_update(cfg: Config) -> tuple:
    """One learner step of the run's update on fixed rows, on a real DeepSpeed engine built as
    the learner builds it (model.path: the 1-layer probe model), with the KL reference the learner
    would load: its metrics (without times) and the exact weights after."""
    import copy
    import random

    import torch

    from learner.engine import build_engine, build_reference
    from learner.update import ContrastGroup, LossRow, UpdateSpec, policy_update

    rng = random.Random(0)
    rows = []
    for g in range(4):
        prompt = [rng.randrange(5, 60) for _ in range(3)]
        for k in range(4):
            resp = [rng.randrange(5, 60) for _ in range(rng.randrange(2, 6))]
            adv = 0.0 if g == 0 else [-1.5, -0.5, 0.5, 1.5][k]
            behav = [-4.0 + rng.uniform(-2, 2) for _ in resp]  # w far from 1, some > cap
            reuse = {(1, 0): "policy_recomputed", (2, 0): "direct_replay"}.get((g, k), "")
            rows.append(LossRow(prompt, resp, behav, adv, 0, group_id=f"g{g}", reuse=reuse))
    contrasts = [ContrastGroup([7, 8, 9], [10, 11, 2], [[12, 13], [14, 15, 16]])]
    spec = UpdateSpec.of(cfg)
    spec = dataclasses.replace(spec, lr=spec.lr * PROBE_LR_SCALE)
    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.set_num_threads(1)  # a tiny model: threads only add their start-up
        try:
            engine = build_engine(cfg, cfg.model.path)
            metrics = policy_update(engine, copy.deepcopy(rows), spec, 0, contrasts,
                                    build_reference(cfg, engine), step=3)
            weights = exact_hash(full_parameters(engine))
        finally:
            torch.set_num_threads(threads)
    shown = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()
             if not k.startswith(("timing/", "perf/")) and k != "optim/lr"}  # lr: a copy
    return json.dumps(shown, sort_keys=True, default=str), weights


def full_parameters(engine) -> list:
    """The engine's parameters, gathered whole under ZeRO-3."""
    import contextlib

    import deepspeed

    params = list(engine.module.parameters())
    whole = (deepspeed.zero.GatheredParameters(params) if engine.zero_optimization_stage() == 3
             else contextlib.nullcontext())
    with whole:
        return [p.detach().clone() for p in params]


def generation(cfg: Config, tok) -> list:
    """The learner's first hand-out, from the coordinator the trainer builds (its work items kept
    instead of sent, to `actors.count` member actors), and what an actor samples for the first
    two items: its scheduler and engine (the probe model, seeded), the run's verifier, every
    verdict awaited before the next decode step (run.deterministic's order, so it repeats)."""
    from actors.worker import engine_kwargs
    from learner.algorithms import AlgorithmState
    from learner.coordinator import ActorState, run_coordinator
    from learner.data import PromptStream

    class Outbox:
        def __init__(self):
            self.sent = []

        def send(self, peer, message):
            self.sent.append((peer, message))

    # the hand-out as in a later epoch: every prompt seen before, 0-4 of 4 answers right
    state = AlgorithmState(cfg)
    for i, p in zip(range(cfg.generation_batch), PromptStream(cfg, tok)):
        state.observe(group(f"seen{i}", p.prompt_id, [k < i % 5 for k in range(4)]))
    coord = run_coordinator(cfg, Outbox(), PromptStream(cfg, tok), state.prompt_counts)
    for i in range(cfg.actors.count):
        peer = f"actor-{i}".encode()
        coord.actors[peer] = ActorState(i, peer, "probe", 0, 0.0, rank=i + 1)
    coord.admit(version=0)
    handed = [(peer, [(p.group_id, p.n, p.prior_correct, p.prior_incorrect) for p in w.prompts])
              for peer, w in coord.endpoint.sent]
    items = [work for _, work in coord.endpoint.sent[:2]]
    inputs = (items, cfg.actors.engine, engine_kwargs(cfg, 0), cfg.rollout.abort_on_first_correct,
              cfg.actors.verifier_timeout_s, cfg.task.reward)
    return handed, memo(inputs, lambda: sample(cfg, tok, items))


def sample(cfg: Config, tok, items: list) -> list:
    """Every sample an actor of `cfg` draws for work `items`, by group."""
    import torch

    from actors.rollouts import Rollouts
    from actors.worker import engine_kwargs, make_engine
    from tasks.verifier import Verifier

    verifiers = _PROBE["verifiers"]
    judge = (cfg.actors.verifier_timeout_s, cfg.task.reward)
    if judge not in verifiers:
        verifiers[judge] = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)
    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.set_num_threads(1)
        try:
            engine = make_engine(cfg.actors.engine, cfg.model.path, **engine_kwargs(cfg, 0))
            rollouts = Rollouts(engine, tok, verifiers[judge],
                                cfg.rollout.abort_on_first_correct, every_verdict=True)
            for work in items:
                rollouts.add_work(work)
            done = []
            while rollouts.busy:
                done += rollouts.step(wait_s=0.1)
        finally:
            torch.set_num_threads(threads)
    return sorted((r.prompt.group_id, [(s.token_ids, s.logprobs, s.stage, s.acc, s.reward,
                                        s.truncated) for s in r.samples]) for r in done)


def warm_start_steps(cfg: Config, tok) -> tuple:
    """The warm start's model before training (its config, written with it, and its seeded
    weights) and its first two supervised steps: the losses and the exact weights after."""
    import itertools

    import torch

    from rlvr.warm_start import initial_model, train_steps

    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.set_num_threads(1)
        try:
            model = initial_model(cfg, tok)
            before = model.config.to_json_string(use_diff=False), exact_hash(model.parameters())
            losses = list(itertools.islice(train_steps(cfg, model, tok), 2))
        finally:
            torch.set_num_threads(threads)
    return before, losses, exact_hash(model.parameters())


def first_solution(cfg: Config, tok):
    from learner.data import PromptStream

    stream = PromptStream(cfg, tok, keep_solutions=True)
    next(stream)
    return stream.pop_solution("g0")


def group(gid: str, prompt: str, accs: list[bool], version: int = 0, stages=None, lengths=None,
          truncated=()):
    """A returned group of prompt `prompt` with one sample per verdict in `accs`."""
    from protocol.messages import Group, Sample

    stages, lengths = stages or [0] * len(accs), lengths or [3 + i for i in range(len(accs))]
    samples = [Sample(token_ids=[7 + a] * n, logprobs=[-0.5 - 0.1 * i] * n,
                      policy_version=version, reward=float(a), acc=a,
                      truncated=i in truncated, stage=s)
               for i, (a, s, n) in enumerate(zip(accs, stages, lengths))]
    return Group(protocol_version=1, policy_version=version, group_id=gid, prompt_id=prompt,
                 actor_id=0, work_id="w", prompt_token_ids=[1, 2], samples=samples)


def two_steps(cfg: Config) -> list:
    """`build_step` on two learner steps of fixed groups: all-fail, all-correct, mixed, late
    stages, truncated and stale responses, a prompt seen twice (reuse, HORA counts)."""
    from learner.algorithms import AlgorithmState, build_step

    T, F = True, False
    steps = [
        [group("g0", "p0", [T, F, F, F, T, F, F, F]), group("g1", "p1", [T] * 8),
         group("g2", "p2", [F] * 8, stages=[0] * 4 + [1] * 4, truncated=(0,)),
         group("g3", "p3", [F, F, F, F, T, F, F, F], stages=[0] * 4 + [1] * 4),
         group("g4", "p4", [T, F, T, F, F, F, F, F, F, F, F, F])],
        [group("g5", "p0", [F] * 8), group("g6", "p2", [T, F] * 4, version=2),
         group("g7", "p3", [F, F, T, F, F, F, F, F], version=3, truncated=(2,))],
    ]
    state, out = AlgorithmState(cfg), []
    for v, groups in enumerate(steps):
        for g in groups:
            state.observe(g)
        b = build_step(groups, state, cfg, 5 + v, v, {"g2": [9, 9, 9], "g5": [9, 9]})
        out.append((b.rows, b.contrasts, json.dumps(b.metrics, sort_keys=True, default=str)))
    return [out, state.counts, state.state_dict()]


def key_type(key: str):
    cls = Config
    *sections, name = key.split(".")
    for part in sections:
        cls = next(f.default_factory for f in dataclasses.fields(cls) if f.name == part)
    return typing.get_type_hints(cls)[name]


def alternatives(key: str, current) -> list[str]:
    """YAML values to try in place of `current`."""
    if key in ALTERNATIVES:
        return ALTERNATIVES[key]
    kind = key_type(key)
    if typing.get_origin(kind) is typing.Literal:
        values = [v for v in typing.get_args(kind) if v != current]
    elif isinstance(current, bool):
        values = [not current]
    elif isinstance(current, int):
        values = [current + 1, current * 2, current - 1, 1]
    elif isinstance(current, float):
        values = [current * 0.5, current + 0.1, 0.9, 2.0]
    elif isinstance(current, (list, tuple)):
        values = [[*current, current[-1]], list(current[:-1])]
    elif isinstance(current, str):
        values = ["question", "ans", "sol", f"{current}x"]
    else:  # None
        values = [3, 100, 1000]
    return [json.dumps(v) for v in values]


def base_for(key: str, task_files: list[str]) -> list[str]:
    """The overrides a key is tried under: two mini-batches and two epochs always (so the ratio
    leaves 1 and the clip terms can act), and the key's section's WHERE."""
    overrides = ["optim.mini_batches=2", "optim.epochs=2"] + [
        extra for prefix, extras in WHERE.items()
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)) for extra in extras]
    on_files = key.startswith("task.") or key == "warm_start.source"
    return overrides + (task_files if on_files else [])


def test_every_key_acts_is_pinned_by_a_run_or_has_one_value(task_files, probe):
    keys = leaf_keys()
    inert, raised, bases = [], [], {}
    for key in keys:
        if key in AT_RUN_TIME or key in ONE_VALUE or key in ON_GPU:
            continue
        overrides = base_for(key, task_files)
        if key in ARITHMETIC:  # the arithmetic task (task.kind: file against the files)
            overrides = [o for o in overrides if o != "task.kind=file"]
        base = load_config(TINY, overrides)
        if tuple(overrides) not in bases:
            bases[tuple(overrides)] = fingerprint(base)
        before = bases[tuple(overrides)]
        current = to_dict(base)
        for part in key.split("."):
            current = current[part]
        paths = dict(o.split("=", 1) for o in task_files)
        other_file = {"task.train_path": paths["task.eval_path"],
                      "task.eval_path": paths["task.train_path"]}
        values = ([json.dumps(other_file[key])] if key in other_file
                  else alternatives(key, current))
        for value in values:
            try:  # `algorithm` selects a preset when the config is loaded
                changed = (load_config(TINY, [*overrides, f"{key}={value}"]) if key == "algorithm"
                           else with_overrides(base, [f"{key}={value}"]))
            except ConfigError:
                continue  # refused there: try another value
            try:
                acted = fingerprint(changed) != before
            except AssertionError as e:  # a value the config takes and the run breaks on
                raised.append(f"{key}={value}: {e}")
                continue
            if acted:
                break
        else:
            inert.append(key)
    assert (raised, inert) == ([], []), (
        "values the config takes but the run cannot:\n" + "\n".join(raised) +
        f"\nkeys whose values change nothing the run computes: {inert}")


@functools.cache
def definitions(path: str) -> dict[str, str]:
    """Source by name of the functions, classes (with their decorators) and module constants of
    `path` and, after them, of every other module of tests/."""
    defined: dict[str, str] = {}
    for module in [ROOT / path, *sorted((ROOT / "tests").glob("*.py"))]:
        lines = module.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                defined.setdefault(node.name, "\n".join(lines[start - 1:node.end_lineno]))
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                defined.setdefault(node.targets[0].id,
                                   "\n".join(lines[node.lineno - 1:node.end_lineno]))
    return defined


def functions_run_by(path: str, name: str) -> list[str]:
    """The source of test `name` in `path` and of what it names that tests/ defines: its
    fixtures, the helpers it calls or hands to a process, the constants it reads, theirs in turn
    (the test's own module first, then conftest and the others)."""
    defined = definitions(path)
    assert name in defined, f"no {path}::{name}"
    sources, todo = {}, [name]
    while todo:
        current = todo.pop()
        if current in sources or current not in defined:
            continue
        sources[current] = defined[current]
        tree = ast.parse(textwrap.dedent(sources[current]))
        todo += [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]  # called, handed on
        todo += [a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 for a in n.args.args]  # its fixtures
    return list(sources.values())


def sets(key: str, source: str) -> bool:
    """`source` sets `key` as `key=...`, or as one value of a parameter it sets as
    f"{key}=..." (a parametrized test)."""
    return f"{key}=" in source or (f'"{key}"' in source and "{key}=" in source)


def test_keys_read_at_run_time_name_a_test_that_sets_them():
    # set through the config by the full dotted name, as `key=value` (an override or a YAML
    # line's text): a keyword argument of a class the key feeds is not the key acting
    keys = leaf_keys()
    unset = []
    for key, where in AT_RUN_TIME.items():
        assert key in keys, key
        path, name = where.split("::")
        if not any(sets(key, source) for source in functions_run_by(path, name)):
            unset.append(f"{key} ({where})")
    assert unset == [], f"pinned to a test that does not set the key: {unset}"
    for key, bad in (ONE_VALUE | ON_GPU).items():
        with pytest.raises(ConfigError, match=key):
            load_config(TINY, [bad])
