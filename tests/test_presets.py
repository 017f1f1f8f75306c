"""Algorithm presets (protocol/config/presets.py) and how load_config layers them:
defaults < preset of `algorithm` < YAML < overrides."""

from pathlib import Path
from typing import get_args

import pytest

from protocol.config import Algorithm, ConfigError, load_config, write_resolved
from protocol.config.presets import ALGORITHMS, merge_under, preset


def yaml_file(tmp_path, text: str = ""):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_every_algorithm_name_is_a_config_choice_with_a_preset():
    assert set(ALGORITHMS) == set(get_args(Algorithm))
    assert all(isinstance(preset(name), dict) for name in ALGORITHMS)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_one_override_selects_each_algorithm_and_the_config_is_valid(tmp_path, name):
    cfg = load_config(yaml_file(tmp_path), [f"algorithm={name}"])
    assert cfg.algorithm == name


def test_grpo_is_fixed_n_with_the_mean_std_advantage(tmp_path):
    cfg = load_config(yaml_file(tmp_path), ["algorithm=grpo"])
    assert (cfg.rollout.policy, cfg.loss.advantage, cfg.ar3po.reuse_mode) == ("fixed", "grpo", "off")
    assert (cfg.loss.clip_low, cfg.loss.clip_high) == (0.2, 0.2)


def test_dapo_turns_on_clip_higher_token_mean_dynamic_sampling_and_overlong_shaping(tmp_path):
    cfg = load_config(yaml_file(tmp_path), ["algorithm=dapo"])
    assert (cfg.loss.clip_low, cfg.loss.clip_high, cfg.loss.aggregation) == (0.2, 0.28, "token-mean")
    assert cfg.dapo.dynamic_sampling and cfg.dapo.signed_reward and cfg.dapo.overlong == "shaping"


def test_drgrpo_and_rloo_change_only_the_advantage_and_aggregation(tmp_path):
    dr = load_config(yaml_file(tmp_path), ["algorithm=drgrpo"])
    assert (dr.loss.advantage, dr.loss.aggregation) == ("drgrpo", "seq-mean-token-sum-norm")
    assert load_config(yaml_file(tmp_path), ["algorithm=rloo"]).loss.advantage == "rloo"


def test_ar3po_is_stop_on_correct_rollout_with_advantage_only_reuse(tmp_path):
    cfg = load_config(yaml_file(tmp_path), ["algorithm=ar3po"])
    assert cfg.rollout.policy == "stop_on_correct" and cfg.ar3po.reuse_mode == "advantage_only"
    assert cfg.ar3po.stage_sizes == (4, 4)


def test_aero_is_explore_and_rescue_with_curation_population_std_and_entropy(tmp_path):
    cfg = load_config(yaml_file(tmp_path), ["algorithm=aero"])
    assert cfg.rollout.policy == "aero" and cfg.aero.curate
    assert (cfg.loss.std_mode, cfg.loss.entropy_coef) == ("population", 1e-3)


@pytest.mark.parametrize("name", ["aero", "hora"])
def test_the_pooling_policies_hand_out_a_whole_step_as_one_work_item(tmp_path, name):
    # AERO's rescue budget and HORA's allocation are pooled per step (4.4, 7.3), and the actor
    # pools over its work item: the preset makes the two the same; an explicit value still wins
    cfg = load_config(yaml_file(tmp_path), [f"algorithm={name}", "rollout.prompts_per_step=24"])
    assert cfg.rollout.prompts_per_work is None and cfg.work_size == 24
    mine = load_config(yaml_file(tmp_path), [f"algorithm={name}", "rollout.prompts_per_work=4"])
    assert mine.work_size == 4
    assert load_config(yaml_file(tmp_path), ["algorithm=grpo"]).work_size == 8


def test_mugrpo_is_the_staged_schedule_with_ratio_to_behaviour_relaxed_clip_and_veto(tmp_path):
    cfg = load_config(yaml_file(tmp_path), ["algorithm=mugrpo", "mugrpo.updates_per_stage=5"])
    assert cfg.mode == "staged" and cfg.staleness.bound == 4
    assert (cfg.loss.old_policy, cfg.loss.clip_low, cfg.loss.clip_high) == ("behaviour", 1.0, 4.0)
    assert cfg.mugrpo.veto_scope == "suffix"


def test_hora_and_gcpo_turn_on_their_own_mechanism(tmp_path):
    assert load_config(yaml_file(tmp_path), ["algorithm=hora"]).rollout.policy == "hora"
    assert load_config(yaml_file(tmp_path), ["algorithm=gcpo"]).gcpo.coef == 1.0


def test_every_knob_can_still_be_overridden(tmp_path):
    cfg = load_config(yaml_file(tmp_path), ["algorithm=ar3po", "ar3po.stage_sizes=[2,2,4]",
                                            "max_staleness=4", "ar3po.reuse_mode=direct_replay"])
    assert cfg.ar3po.stage_sizes == (2, 2, 4) and cfg.max_staleness == 4
    assert cfg.ar3po.reuse_mode == "direct_replay"


def test_yaml_keys_win_over_the_preset_and_overrides_win_over_yaml(tmp_path):
    path = yaml_file(tmp_path, "algorithm: dapo\nloss:\n  clip_high: 0.3\n  aggregation: token-mean\n")
    assert load_config(path).loss.clip_high == 0.3
    assert load_config(path, ["loss.clip_high=0.25"]).loss.clip_high == 0.25


def test_an_empty_section_in_yaml_still_takes_the_preset(tmp_path):
    cfg = load_config(yaml_file(tmp_path, "algorithm: dapo\nloss:\n"))
    assert cfg.loss.clip_high == 0.28


def test_an_algorithm_override_replaces_the_preset_named_in_yaml(tmp_path):
    cfg = load_config(yaml_file(tmp_path, "algorithm: dapo\n"), ["algorithm=hora"])
    assert cfg.algorithm == "hora" and cfg.rollout.policy == "hora"
    assert cfg.loss.clip_high == 0.2 and not cfg.dapo.dynamic_sampling


def test_combinations_that_make_sense_are_valid(tmp_path):
    hora_rloo = load_config(yaml_file(tmp_path), ["algorithm=hora", "loss.advantage=rloo"])
    assert (hora_rloo.rollout.policy, hora_rloo.loss.advantage) == ("hora", "rloo")
    ar3po_async = load_config(yaml_file(tmp_path), ["algorithm=ar3po", "mode=async"])
    assert ar3po_async.loss.old_policy == "proximal" and ar3po_async.staleness.bound == 2


def test_an_unknown_algorithm_is_an_error_that_lists_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="'algorithm' must be one of .*'ar3po'"):
        load_config(yaml_file(tmp_path), ["algorithm=ppo"])


def test_a_bad_per_algorithm_value_names_its_key(tmp_path):
    with pytest.raises(ConfigError, match="ar3po: stage_sizes"):
        load_config(yaml_file(tmp_path), ["algorithm=ar3po", "ar3po.stage_sizes=[1,4]"])
    with pytest.raises(ConfigError, match="ar3po: stage_sizes .* >= 2"):  # any stage (3.2)
        load_config(yaml_file(tmp_path), ["algorithm=ar3po", "ar3po.stage_sizes=[4,1]"])
    with pytest.raises(ConfigError, match="aero"):
        load_config(yaml_file(tmp_path), ["aero.n_explore=20"])


def test_the_resolved_config_loads_back_equal_without_reapplying_a_preset(tmp_path):
    cfg = load_config(yaml_file(tmp_path), ["algorithm=mugrpo", "loss.clip_high=0.5"])
    path = write_resolved(cfg, tmp_path / "run")
    assert load_config(path) == cfg


def test_merge_under_fills_missing_keys_only_and_does_not_mutate_its_inputs():
    defaults = {"loss": {"a": 1, "b": 2}, "mode": "staged"}
    data = {"loss": {"b": 3}, "x": 4}
    assert merge_under(defaults, data) == {"loss": {"a": 1, "b": 3}, "mode": "staged", "x": 4}
    assert defaults == {"loss": {"a": 1, "b": 2}, "mode": "staged"} and data == {"loss": {"b": 3}, "x": 4}


def test_the_tiny_cpu_default_is_ar3po_in_async_mode():
    cfg = load_config(Path(__file__).parents[1] / "configs" / "tiny-cpu.yaml")
    assert (cfg.algorithm, cfg.mode, cfg.rollout.policy) == ("ar3po", "async", "stop_on_correct")


def test_on_the_tiny_config_one_override_switches_to_the_staged_mugrpo_schedule():
    cfg = load_config(Path(__file__).parents[1] / "configs" / "tiny-cpu.yaml", ["algorithm=mugrpo"])
    assert cfg.mode == "staged"
