"""Config values that would do nothing, hang or divide by zero are refused before any process
starts, each with a message that names its key (protocol/config/checks.py); old spellings of a
renamed value name the new one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from protocol.config import ConfigError, load_config, to_dict, with_overrides

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny-cpu.yaml"


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(TINY, list(overrides))
    return str(e.value)


# each case: overrides -> the key the message must name (and a word of why)
REFUSED = [
    (["weight_sync.sync_every=0"], "'weight_sync.sync_every' must be >= 1"),
    (["actors.inflight_update=abort", "actors.abort_limit=0"],
     r"'actors.abort_limit' must be >= 1, got 0 \(a sample never aborted is .*continue"),
    (["actors.inflight_update=continue", "actors.abort_limit=5"],
     r"'actors.abort_limit' \(5\) acts only under actors.inflight_update abort"),
    (["mode=async", "max_staleness=1", "weight_sync.sync_every=3"],
     r"'weight_sync.sync_every' \(3\) must be <= max_staleness \+ 1 \(2\)"),
    (["mode=sync", "weight_sync.sync_every=2"], "'weight_sync.sync_every' must be 1 in mode sync"),
    (["algorithm=mugrpo", "weight_sync.sync_every=2"],
     "'weight_sync.sync_every' does nothing in mode staged"),
    (["optim.mini_batches=1", "optim.group_order=arrival"],
     r"'optim.group_order' \(arrival\) acts only with optim.mini_batches > 1"),
    (["stale_inject=-1"], r"'stale_inject' must be >= 0"),
    (["algorithm=mugrpo", "stale_inject=4"], r"'stale_inject' \(4\) is refused in mode staged"),
    (["loss.trust_region=m2po"], r"'loss.trust_region' m2po needs loss.old_policy behaviour"),
    (["loss.old_policy=behaviour", "loss.trust_region=m2po", "loss.m2po_tau=0"],
     r"'loss.m2po_tau' must be > 0"),
    # keys set where the rest of the config never reads them
    (["loss.old_policy=behaviour", "loss.trust_region=m2po", "loss.clip_high=0.28"],
     r"'loss.clip_high' \(0.28\) does nothing with loss.trust_region m2po"),
    (["loss.m2po_tau=0.1"], r"'loss.m2po_tau' \(0.1\) does nothing with loss.trust_region clip"),
    (["mode=sync", "max_staleness=3"], r"'max_staleness' \(3\) does nothing in mode sync"),
    (["algorithm=mugrpo", "max_staleness=0"],
     r"'max_staleness' \(0\) does nothing in mode staged: its staleness bound is mugrpo"),
    (["mode=sync", "stale_policy=drop"], r"'stale_policy' \(drop\) does nothing in mode sync"),
    (["stale_downweight=0.8"], r"'stale_downweight' \(0.8\) acts only under stale_policy down"),
    (["stale_policy=downweight", "stale_downweight=1"], r"'stale_downweight' must be in \(0, 1\)"),
    (["algorithm=ar3po", "rollout.group_size=16"],
     r"'rollout.group_size' \(16\) is unused by rollout.policy stop_on_correct"),
    (["algorithm=aero", "rollout.group_size=16"],
     r"'rollout.group_size' \(16\) is unused by rollout.policy aero, which spends aero.n_\*"),
    (["loss.old_policy=behaviour", "loss.behav_weight_mode=mask"],
     r"'loss.behav_weight_mode' \(mask\) does nothing under loss.old_policy behaviour"),
    (["algorithm=mugrpo", "loss.behav_weight_cap=3"],
     r"'loss.behav_weight_cap' \(3.0\) does nothing under loss.old_policy behaviour"),
    (["loss.behav_weight_mode=off", "loss.behav_weight_cap=3"],
     r"'loss.behav_weight_cap' \(3.0\) does nothing with loss.behav_weight_mode off"),
    (["algorithm=grpo", "ar3po.buffer_pick=uniform"],
     r"'ar3po.buffer_pick' \(uniform\) does nothing with ar3po.reuse_mode off"),
    (["algorithm=ar3po", "ar3po.buffer_size=8"],
     r"'ar3po.buffer_size' \(8\) does nothing with ar3po.buffer_pick latest"),
    (["loss.kl_kind=k1"], r"'loss.kl_kind' \(k1\) does nothing with loss.kl_beta 0"),
    (["algorithm=gcpo", "gcpo.beta_c=2"], r"'gcpo.beta_c' \(2.0\) does nothing with gcpo.form gated"),
    (["aero.negative_pick=random"], r"'aero.negative_pick' was removed: .* uniformly random"),
    (["rollout.top_p=0.9"], "'rollout.top_p' must be 1.0 for training"),
    (["rollout.temperature=0"], "'rollout.temperature' must be > 0"),
    (["rollout.prompts_per_step=0"], "'rollout.prompts_per_step' must be > 0"),
    (["rollout.prompts_per_work=0"], "'rollout.prompts_per_work' must be > 0"),
    (["rollout.max_new_tokens=0"], "'rollout.max_new_tokens' must be > 0"),
    (["run.eval_every=0"], "'run.eval_every' must be > 0"),
    (["warm_start.source=task"], "'warm_start.source' task warm-starts the embedded tiny model"),
    (["run.eval_on=actors", "actors.engine=vllm", "actors.kv_cache_gib=1"],
     "'run.eval_on' actors needs actors.engine hf"),
    (["run.deterministic=true", "mode=async"],
     "'run.deterministic' needs mode sync, actors.engine hf and run.eval_on learner, got async"),
    (["run.deterministic=true", "mode=sync", "rollout.prompts_per_work=4"],
     r"'rollout.prompts_per_work' \(4\) does nothing under run.deterministic: each actor takes "
     r"its share of a generation round in one work item \(32 prompts\)"),
    (["run.checkpoint_every=-1"], "'run.checkpoint_every' must be >= 0"),
    (["run.keep_checkpoints=0"], "'run.keep_checkpoints' must be > 0"),
    (["task.eval_samples=0"], "'task.eval_samples' must be > 0"),
    (["task.eval_per_level=0"], "'task.eval_per_level' must be >= 1"),
    (["task.levels=[]", "task.level_weights=[]", "warm_start.level_weights=null"],
     "'task.levels' must be a non-empty list"),
    (["task.level_weights=[0,0,0]"], "'task.level_weights' must be >= 0 with a positive sum"),
    (["warm_start.level_weights=[0.5,-1,0]"], "'warm_start.level_weights' must be >= 0"),
    (["warm_start.label_noise=1.5"], "'warm_start.label_noise' must be in"),
    (["warm_start.batch_size=0"], "'warm_start.batch_size' must be > 0"),
    (["optim.lr=0"], "'optim.lr' must be > 0"),
    (["optim.grad_clip=-1"], "'optim.grad_clip' must be >= 0"),
    (["optim.zero_stage=4"], "'optim.zero_stage' must be 0, 1, 2 or 3"),
    (["model.device=gpu"], "'model.device' must be cpu, cuda or cuda:N, got 'gpu'"),
    (["weight_sync.backend=nccl"], "'weight_sync.backend' nccl needs the model on CUDA"),
    (["actors.threads=0"], "'actors.threads' must be > 0"),
    (["actors.max_batch=0"], "'actors.max_batch' must be > 0"),
    (["actors.heartbeat_s=0"], "'actors.heartbeat_s' must be > 0"),
    (["actors.verifier_timeout_s=0"], "'actors.verifier_timeout_s' must be > 0"),
    (["actors.gpu_memory_utilization=0"], "'actors.gpu_memory_utilization' must be in"),
    (["learner.micro_batch=0"], "'learner.micro_batch' must be > 0"),
    (["weight_sync.timeout_s=0"], "'weight_sync.timeout_s' must be > 0"),
    (["actors.start_timeout_s=0"], "'actors.start_timeout_s' must be > 0"),
    (["weight_sync.bucket_mb=0"], "'weight_sync.bucket_mb' must be > 0"),
    (["net.zmq_port=70000"], "'net.zmq_port' must be a port"),
    (["model.hidden=130"], "'model.hidden' .* must be a multiple of 'model.heads'"),
    (["model.layers=0"], "'model.layers' must be > 0"),
    (["rollout.max_new_tokens=256"], "'model.max_positions' \\(256\\) must exceed "
     "'rollout.max_new_tokens' \\(256\\)"),
    (["warm_start.micro_batch=0"], "'warm_start.micro_batch' must be >= 1"),
    (["loss.clip_low=1.5"], "'loss.clip_low' must be in"),
    (["loss.dual_clip=1.0"], "'loss.dual_clip' must be > 1"),
    (["loss.behav_weight_cap=0"], "'loss.behav_weight_cap' must be > 0"),
    (["algorithm=grpo", "rollout.abort_on_first_correct=true"],
     "'rollout.abort_on_first_correct' does nothing with rollout.policy 'fixed'"),
    (["algorithm=hora", "rollout.abort_on_first_correct=true"],
     "'rollout.abort_on_first_correct' does nothing .* 'hora' \\(one phase\\)"),
]


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[m.split("'")[1] + "/" + o[-1]
                                                            for o, m in REFUSED])
def test_a_value_that_cannot_work_is_refused_naming_its_key(overrides, message):
    text = refusal(*overrides)
    assert re.search(message, text), text


def test_sync_every_within_the_staleness_bound_is_accepted_whatever_the_stale_policy():
    for policy in ("tis", "drop", "downweight"):
        ok = load_config(TINY, ["mode=async", "max_staleness=2", "weight_sync.sync_every=3",
                                f"stale_policy={policy}"])
        assert ok.weight_sync.sync_every == 3
    # admission counts the actors' weights: past the bound the learner would wait forever,
    # whether or not the consumption rule keeps stale groups
    assert "must be <= max_staleness + 1" in refusal("mode=async", "max_staleness=0",
                                                     "weight_sync.sync_every=4", "stale_policy=tis")


def test_a_consumption_rule_that_filters_by_length_is_said_at_the_start():
    from protocol.config.checks import config_warnings

    assert load_config(TINY).stale_policy == "tis" and config_warnings(load_config(TINY)) == []
    for policy in ("drop", "downweight"):
        (warning,) = config_warnings(load_config(TINY, ["mode=async", f"stale_policy={policy}"]))
        assert f"stale_policy '{policy}'" in warning and "length and difficulty" in warning
    # tis with the behaviour weight off keeps the stale groups but corrects nothing
    (warning,) = config_warnings(load_config(TINY, ["mode=async", "loss.behav_weight_mode=off"]))
    assert "loss.behav_weight_mode 'off'" in warning and "uncorrected" in warning


def test_every_problem_is_listed_at_once():
    text = refusal("run.eval_every=0", "rollout.top_p=0.5", "actors.count=0", "run.steps=0")
    assert "'run.eval_every'" in text and "'rollout.top_p'" in text
    assert "actors.count must be >= 1" in text and "run.steps must be >= 1" in text


def test_the_old_staged_rollout_policy_is_refused_naming_stop_on_correct(tmp_path):
    assert "'rollout.policy': 'staged' was renamed 'stop_on_correct'" in \
        refusal("rollout.policy=staged")
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("algorithm: ar3po\nrollout:\n  policy: staged\n")
    with pytest.raises(ConfigError, match="renamed 'stop_on_correct'"):
        load_config(old_yaml)
    with pytest.raises(ConfigError, match="renamed 'stop_on_correct'"):
        with_overrides(load_config(TINY), ["rollout.policy=staged"])
    assert load_config(old_yaml, ["rollout.policy=stop_on_correct"]).rollout.policy == \
        "stop_on_correct"


def test_a_bad_value_is_refused_by_rlvr_train_before_anything_starts(tmp_path):
    from rlvr.launch import train

    with pytest.raises(ConfigError, match="'weight_sync.sync_every' must be >= 1"):
        train(str(TINY), [f"run.out_dir={tmp_path}", "weight_sync.sync_every=0"], None,
              dry_run=True)
    assert not any(tmp_path.iterdir())


def test_a_run_folder_resumes_under_the_rules_it_started_with(tmp_path):
    import yaml

    # a resolved config written before aero.negative_pick went and before rollout.group_size
    # was refused under aero: a new run is refused, the run folder still loads
    old = load_config(TINY, ["algorithm=aero"])
    data = yaml.safe_load(yaml.safe_dump(to_dict(old)))
    data["aero"]["negative_pick"] = "random"
    data["rollout"]["group_size"] = 16
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="negative_pick"):
        load_config(path)
    cfg = load_config(path, run_folder=True)
    assert cfg.rollout.group_size == 16 and cfg.rollout.policy == "aero"


def test_a_tool_running_one_yaml_in_several_modes_sets_the_keys_it_leaves_inert_to_defaults():
    from protocol.config.inert import neutral_overrides

    shape = Path(__file__).resolve().parents[1] / "configs" / "real-shape-cpu.yaml"
    with pytest.raises(ConfigError, match="'max_staleness' \\(1\\) does nothing in mode sync"):
        load_config(shape, ["mode=sync"])
    reset = neutral_overrides(load_config(shape, ["mode=sync"], refuse_inert=False))
    assert reset == ["max_staleness=2"]
    assert load_config(shape, ["mode=sync", *reset]).staleness.bound == 0
