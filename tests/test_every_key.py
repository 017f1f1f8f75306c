"""Every config key acts: it changes what the run computes from its config, or a test that runs
the processes pins what it does, or it is refused where it cannot act.

A key that nothing reads does nothing whatever its value (`aero.negative_pick` and
`ar3po.buffer_pick` once were such keys). Three checks, over every field of `Config`:
- read: an attribute read of its name exists in the code that runs (outside the value checks in
  protocol/config_checks.py and the sections' own `validate`);
- acts: a value other than the base config's changes a fingerprint of everything the run derives
  from its config without starting a process (the update spec, DeepSpeed and AdamW settings,
  the rollout spec handed to actors, the engine's arguments, the prompt stream, the held-out
  set, two steps of `build_step` on fixed groups, the warm start's cache key, admission's
  bound, the start-up warnings); or
- pinned at run time: keys read only inside running processes (ports, heartbeats, the number
  of actors, ...) name the test that runs with them, and that test's source sets the key.
Combinations where a key cannot act are refused (tests/test_config_checks.py).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import typing
from pathlib import Path

import pytest

from protocol.config import Config, ConfigError, load_config, to_dict, with_overrides

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny-cpu.yaml"
CODE = ("actors", "learner", "protocol", "rlvr", "tasks")
ONLY_CHECKS = {"protocol/config_checks.py"}

# keys read only inside running processes -> (the test that runs with the key set, the word in
# its source that sets it: the key's name, or the argument the key becomes in the code it feeds)
AT_RUN_TIME = {
    "task.reward": ("tests/test_reward_e2e.py::test_a_reward_function_of_the_users_trains_logs_"
                    "its_scores_and_survives_its_errors", "task.reward"),
    "run.steps": ("tests/test_e2e.py::test_sync_mode_is_exactly_on_policy", "run.steps"),
    "run.eval_every": ("tests/test_e2e.py::test_sync_mode_is_exactly_on_policy", "eval_every"),
    "run.deterministic": ("tests/test_deterministic.py::test_a_sync_run_with_two_actors_"
                          "repeats_bit_for_bit", "run.deterministic"),
    "run.eval_on": ("tests/test_actor_eval.py::test_actors_evaluate_what_the_learner_would_"
                    "answer_for_answer", "run.eval_on"),
    "run.checkpoint_every": ("tests/test_faults.py::test_a_learner_killed_mid_run_resumes_losing_"
                             "no_prompt_and_repeating_none", "run.checkpoint_every"),
    "run.keep_checkpoints": ("tests/test_checkpoint.py::test_keep_last_prunes_older_checkpoints",
                             "keep_last"),
    "run.wandb": ("tests/test_run_log.py::test_wandb_offline_writes_its_files_under_the_run_"
                  "folder_only", "wandb_mode"),
    "run.progress": ("tests/test_run_log.py::test_wandb_offline_writes_its_files_under_the_run_"
                     "folder_only", "progress="),
    "model.path": ("tests/test_e2e.py::test_sync_mode_is_exactly_on_policy", "tiny_model"),
    "warm_start.cache_dir": ("tests/test_warm_start.py::test_the_warm_start_command_refuses_no_"
                             "threads_and_two_at_once_build_one_model", "cache_dir"),
    "task.eval_samples": ("tests/test_eval.py::trained_run", "task.eval_samples"),
    "rollout.abort_on_first_correct": ("tests/test_streaming_actor.py::test_siblings_of_a_first_"
                                       "correct_answer_stop_and_are_counted",
                                       "abort_on_first_correct"),
    "actors.count": ("tests/test_faults.py::test_an_actor_killed_twice_is_restarted_and_the_run_"
                     "finishes_with_no_group_twice", "actors.count"),
    "actors.threads": ("tests/test_e2e.py::test_async_mode_advances_actor_versions_within_the_"
                       "staleness_bound", "actors.threads"),
    "learner.threads": ("tests/test_e2e.py::test_async_mode_advances_actor_versions_within_the_"
                        "staleness_bound", "learner.threads"),
    "actors.heartbeat_s": ("tests/test_slurm_cluster.py::test_a_real_async_run_is_preempted_"
                           "requeued_and_resumes_without_gaps", "actors.heartbeat_s"),
    "actors.heartbeat_timeout_s": ("tests/test_slurm_cluster.py::test_a_real_async_run_is_"
                                   "preempted_requeued_and_resumes_without_gaps",
                                   "actors.heartbeat_timeout_s"),
    "actors.start_timeout_s": ("tests/test_coordinator.py::test_the_start_waits_for_every_actors_"
                               "hello_and_gives_up_naming_the_key", "start_timeout_s"),
    "weight_sync.timeout_s": ("tests/test_slurm_cluster.py::test_a_real_async_run_is_preempted_"
                              "requeued_and_resumes_without_gaps", "weight_sync.timeout_s"),
    "actors.max_restarts": ("tests/test_faults.py::test_an_actor_killed_twice_is_restarted_and_"
                            "the_run_finishes_with_no_group_twice", "actors.max_restarts"),
    "actors.verifier_timeout_s": ("tests/test_verifier.py::test_a_slow_item_is_stopped_by_the_"
                                  "childs_timer_without_a_restart", "timeout_s"),
    "actors.inflight_update": ("tests/test_e2e.py::test_sync_mode_is_exactly_on_policy",
                               "actors.inflight_update"),
    "actors.abort_limit": ("tests/test_streaming_actor.py::test_under_abort_a_sample_restarted_"
                           "abort_limit_times_decodes_on_through_the_next_sync", "abort_limit"),
    "learner.ranks": ("tests/test_learner_ranks.py::test_a_run_with_two_learner_ranks_trains_"
                      "checkpoints_and_resumes", "learner.ranks"),
    "learner.grad_checkpointing": ("tests/test_learner_ranks.py::test_gradient_checkpointing_"
                                   "recomputes_the_same_gradient", "grad_checkpointing"),
    "net.learner_host": ("tests/test_slurm_roles.py::test_an_actor_gets_its_id_and_the_learner_"
                         "address_but_no_rendezvous_env", "learner_host"),
    "net.bind_host": ("tests/test_slurm_roles.py::test_a_learner_rank_gets_the_rendezvous_env_"
                      "and_binds_every_interface", "bind_host"),
    "net.zmq_port": ("tests/test_slurm_roles.py::test_roles_of_one_job_agree_on_ports",
                     "zmq_port"),
    "net.weights_port": ("tests/test_slurm_roles.py::test_roles_of_one_job_agree_on_ports",
                         "weights_port"),
    "net.master_port": ("tests/test_slurm_roles.py::test_roles_of_one_job_agree_on_ports",
                        "master_port"),
    "net.curve_dir": ("tests/test_curve.py::keyed_actor_process", "curve_dir"),
    "weight_sync.sync_every": ("tests/test_e2e.py::test_weights_published_every_other_step_"
                               "keep_admission_within_the_bound", "weight_sync.sync_every"),
    "weight_sync.bucket_mb": ("tests/test_weights.py::test_rank_zero_broadcasts_a_module_to_two_"
                              "actor_processes", "bucket_bytes"),
    "dapo.max_gen_batches": ("tests/test_algorithms_e2e.py::test_dapo_gives_up_filling_a_step_"
                             "after_max_gen_batches", "dapo.max_gen_batches"),
}
# keys with one working value: any other is refused (the value check names why)
ONE_VALUE = {"rollout.top_p": "rollout.top_p=0.9"}
# the overrides under which a key can act (elsewhere another value is refused or does nothing)
WHERE = {
    "stale_downweight": ["stale_policy=downweight"],
    "loss.kl_kind": ["loss.kl_beta=0.05"],
    "loss.trust_region": ["loss.old_policy=behaviour"],
    "loss.m2po_tau": ["loss.old_policy=behaviour", "loss.trust_region=m2po"],
    "gcpo.beta_c": ["algorithm=gcpo", "gcpo.form=logsigmoid"],
    "optim.group_order": ["optim.mini_batches=2"],
    "actors.engine": ["actors.kv_cache_gib=1"],
    "rollout.group_size": ["algorithm=grpo"],
    "ar3po.": ["algorithm=ar3po", "ar3po.reuse_mode=direct_replay", "ar3po.buffer_pick=uniform"],
    "aero.": ["algorithm=aero"], "hora.": ["algorithm=hora"], "dapo.": ["algorithm=dapo"],
    "mugrpo.": ["algorithm=mugrpo"], "gcpo.": ["algorithm=gcpo"],
    "actors.": ["actors.engine=vllm", "actors.kv_cache_gib=1"],
    "warm_start.source": ["task.kind=file"],  # with the files the fixture writes
    "task.": ["task.kind=file"],  # with the files the fixture writes, but for:
}
ARITHMETIC = {"task.levels", "task.level_weights", "task.ops", "task.eval_per_level",
              "task.response_format", "task.kind"}
# alternative values the automatic choice (another literal, +1, x0.5, ...) would not find
ALTERNATIVES = {
    "task.levels": ["[1, 2, 4]"], "task.level_weights": ["[0.5, 0.3, 0.2]"],
    "warm_start.level_weights": ["[0.2, 0.8, 0.0]"], "task.ops": ['["+", "-"]'],
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


SECTIONS = {f.name: f.default_factory.__name__ for f in dataclasses.fields(Config)
            if dataclasses.is_dataclass(f.default_factory)}
"""Config's sections by attribute name: "rollout" -> "RolloutConfig"."""


def _section_of_annotation(annotation) -> str | None:
    """The section a parameter or field annotated `RolloutConfig`, `MuGRPOConfig | None` or
    "LossConfig" holds."""
    if annotation is None:
        return None
    text = annotation.value if isinstance(annotation, ast.Constant) else ast.unparse(annotation)
    names = {part.strip() for part in str(text).split("|")}
    return next((s for s, cls in SECTIONS.items() if cls in names), None)


def key_reads() -> set[str]:
    """Config keys read in the code that runs (not in the value checks nor a `validate`), by
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
                   if isinstance(fn, ast.FunctionDef) and fn.name == "validate"
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


def fingerprint(cfg: Config) -> dict[str, str]:
    """What the run derives from `cfg` before any process starts, part by part."""
    from actors.worker import engine_kwargs
    from learner.data import PromptStream, held_out, responses_cap, rollout_spec
    from learner.engine import adamw_kwargs, deepspeed_config
    from learner.update import UpdateSpec
    from rlvr.warm_start import warm_start_key
    from tasks.tiny_model import build_tokenizer

    tok = build_tokenizer()
    parts = {
        "update": lambda: probe_update(cfg),
        "optimizer": lambda: (adamw_kwargs(cfg), deepspeed_config(cfg)),
        "rollout": lambda: (rollout_spec(cfg), responses_cap(cfg), cfg.generation_batch),
        "engine": lambda: engine_kwargs(cfg, 0),
        "warm_start": lambda: warm_start_key(cfg),
        "held_out": lambda: [(p.question, p.answer) for p in held_out(cfg)],
        "stream": lambda: [(p.prompt_token_ids, p.answer, p.n, s) for p, s in zip(
            PromptStream(cfg, tok, keep_solutions=True), range(24))],
        "solutions": lambda: first_solution(cfg, tok),
        "steps": lambda: two_steps(cfg),
        "schedule": lambda: (cfg.staleness_bound, cfg.admitted_staleness, cfg.work_size, cfg.weight_backend,
                             str(cfg.run_dir)),
    }
    out = {}
    for name, part in parts.items():
        try:
            out[name] = repr(part())
        except Exception as e:  # noqa: BLE001 - a part that fails is part of the print
            out[name] = f"error: {e!r}"
    return out


_PROBE: dict = {}


def probe_update(cfg: Config) -> tuple:
    """The update's scalar settings and what one learner step does with them on fixed rows (a
    1-layer tiny model, plain SGD behind the engine's calls): its metrics and the weights after.
    The config objects inside UpdateSpec are left out of the print: only their effect counts.
    Two mini-batches at least, so the ratio leaves 1 and the clip terms can act."""
    import copy
    import random

    import torch

    from learner.update import ContrastGroup, LossRow, UpdateSpec, policy_update
    from tasks.tiny_model import build_model, build_tokenizer
    from tests.sgd_engine import SGDEngine

    if not _PROBE:
        torch.manual_seed(0)
        _PROBE["model"] = build_model(build_tokenizer(), hidden=16, layers=1, heads=2, ffn=32)
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
        _PROBE["rows"] = rows
        _PROBE["contrasts"] = [ContrastGroup([7, 8, 9], [10, 11, 2], [[12, 13], [14, 15, 16]])]
    spec = UpdateSpec.of(cfg)
    scalars = {k: v for k, v in vars(spec).items() if k not in ("loss", "veto", "gcpo")}
    spec = dataclasses.replace(spec, mini_batches=max(2, spec.mini_batches),
                               epochs=max(2, spec.epochs), micro_batch=4)
    model = copy.deepcopy(_PROBE["model"])
    reference = copy.deepcopy(model).eval() if spec.loss.kl_beta > 0 else None
    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.set_num_threads(1)  # a tiny model: threads only add their start-up
        metrics = policy_update(SGDEngine(model, 1.0), _PROBE["rows"],
                                dataclasses.replace(spec, lr=20.0), 0,
                                _PROBE["contrasts"], reference, step=3)
        torch.set_num_threads(threads)
    timings = [k for k in metrics if k.startswith(("timing/", "perf/"))]
    shown = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()
             if k not in timings}
    weights = round(float(sum(p.detach().double().abs().sum() for p in model.parameters())), 5)
    return scalars, json.dumps(shown, sort_keys=True, default=str), weights


def first_solution(cfg: Config, tok):
    from learner.data import PromptStream

    stream = PromptStream(cfg, tok, keep_solutions=True)
    next(stream)
    return stream.pop_solution("g0")


def two_steps(cfg: Config) -> list:
    """`build_step` on two learner steps of fixed groups: all-fail, all-correct, mixed, late
    stages, truncated and stale responses, a prompt seen twice (reuse, HORA counts)."""
    from learner.algorithms import AlgorithmState, build_step
    from protocol.messages import Group, Sample

    def group(gid, prompt, accs, version=0, stages=None, lengths=None, truncated=()):
        stages, lengths = stages or [0] * len(accs), lengths or [3 + i for i in range(len(accs))]
        samples = [Sample(token_ids=[7 + a] * n, logprobs=[-0.5 - 0.1 * i] * n,
                          policy_version=version, reward=float(a), acc=a,
                          truncated=i in truncated, stage=s)
                   for i, (a, s, n) in enumerate(zip(accs, stages, lengths))]
        return Group(protocol_version=1, policy_version=version, group_id=gid, prompt_id=prompt,
                     actor_id=0, work_id="w", prompt_token_ids=[1, 2], samples=samples)

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
    overrides = [o for prefix, os in WHERE.items() if key == prefix or (
        prefix.endswith(".") and key.startswith(prefix)) for o in os]
    if key == "actors.engine":
        overrides = WHERE[key]
    on_files = key.startswith("task.") or key == "warm_start.source"
    return overrides + (task_files if on_files else [])


def test_every_key_acts_is_pinned_by_a_run_or_has_one_value(task_files):
    keys = leaf_keys()
    inert, bases = [], {}
    for key in keys:
        if key in AT_RUN_TIME or key in ONE_VALUE:
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
        for value in alternatives(key, current):
            try:  # `algorithm` selects a preset when the config is loaded
                changed = (load_config(TINY, [*overrides, f"{key}={value}"]) if key == "algorithm"
                           else with_overrides(base, [f"{key}={value}"]))
            except ConfigError:
                continue  # refused there: try another value
            if fingerprint(changed) != before:
                break
        else:
            inert.append(key)
    assert inert == [], f"keys whose values change nothing the run derives: {inert}"


def test_keys_read_at_run_time_name_a_test_that_sets_them():
    for key, (where, word) in AT_RUN_TIME.items():
        assert key in leaf_keys(), key
        path, name = where.split("::")
        source = (ROOT / path).read_text()
        fn = next((f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef)
                   and f.name == name), None)
        assert fn is not None, f"{key}: no {where}"
        assert word in ast.get_source_segment(source, fn), f"{key}: {where} does not set it"
    for key, bad in ONE_VALUE.items():
        with pytest.raises(ConfigError, match=key):
            load_config(TINY, [bad])
