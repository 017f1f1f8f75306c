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
import textwrap
import typing
from pathlib import Path

import pytest

from protocol.config import Config, ConfigError, load_config, to_dict, with_overrides
from tests.key_fingerprint import fingerprint, probe, task_files  # noqa: F401 - fixtures

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


# -- acts: the fingerprint (tests/key_fingerprint.py) ----------------------------------------

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
