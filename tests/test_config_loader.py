"""The config loader turns YAML plus `a.b=value` overrides into frozen dataclasses, or fails early
naming the dotted key. Run: `.venv/bin/pytest tests/test_config_loader.py -q`."""

from __future__ import annotations

import re
import string
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.config.loader import ConfigError, build, describe, dump, field_docs, load, to_dict


@dataclass(frozen=True)
class Rollout:
    max_new_tokens: int = 512
    """Tokens to generate per response."""
    temperature: float = 1.0
    """Sampling temperature."""
    policy: Literal["grpo", "ar3po", "aero"] = "grpo"
    """Which rollout policy runs at the actor."""
    stage_sizes: tuple[int, ...] = (4, 4)
    """AR3PO: responses per stage,
    in order."""
    seed: int | None = None
    """Sampling seed; null draws one."""


@dataclass(frozen=True)
class Optim:
    lr: float = 1e-6
    """Learning rate."""
    clip_low: float = 0.2
    clip_high: float = 0.28
    betas: tuple[float, ...] = (0.9, 0.999)

    def validate(self) -> None:
        if self.clip_high < self.clip_low:
            raise ConfigError(f"clip_high ({self.clip_high}) must be >= clip_low ({self.clip_low})")


@dataclass(frozen=True)
class Config:
    name: str = "tiny"
    """Run name: the folder under runs/."""
    mode: Literal["sync", "async", "staged"] = "sync"
    max_staleness: int = 0
    use_wandb: bool = False
    tags: tuple[str, ...] = ()
    rollout: Rollout = field(default_factory=Rollout)
    """How actors sample."""
    optim: Optim = Optim(lr=3e-6)

    def validate(self) -> None:
        if self.mode == "sync" and self.max_staleness != 0:
            raise ConfigError("mode 'sync' needs max_staleness 0")


def error(data: dict, overrides=(), cls=Config) -> str:
    """The message of the ConfigError that building `cls` from `data` and `overrides` raises."""
    with pytest.raises(ConfigError) as e:
        build(cls, data, overrides)
    return str(e.value)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


# --- YAML and overrides ---------------------------------------------------------------------------


def test_defaults_fill_everything_when_the_file_is_empty(tmp_path):
    assert load(Config, write(tmp_path, "")) == Config()


def test_a_missing_section_takes_its_default_including_a_parents_default_instance():
    cfg = build(Config, {"name": "x"})
    assert cfg.rollout == Rollout() and cfg.optim.lr == 3e-6


def test_an_empty_section_header_means_defaults(tmp_path):
    assert load(Config, write(tmp_path, "rollout:\n")).rollout == Rollout()


def test_overrides_win_over_yaml_and_yaml_wins_over_defaults(tmp_path):
    path = write(tmp_path, "name: a\nrollout:\n  max_new_tokens: 64\n  temperature: 0.7\n")
    cfg = load(Config, path, ["rollout.max_new_tokens=128", "optim.lr=1e-4", "use_wandb=true"])
    assert cfg.name == "a" and cfg.rollout.temperature == 0.7  # from YAML
    assert cfg.rollout.max_new_tokens == 128 and cfg.optim.lr == 1e-4 and cfg.use_wandb  # overrides
    assert cfg.optim.clip_low == 0.2  # default


def test_overrides_parse_yaml_values_lists_and_null():
    cfg = build(Config, {}, ["rollout.stage_sizes=[2,2,4]", "rollout.seed=7", "tags=[a, b]"])
    assert cfg.rollout.stage_sizes == (2, 2, 4) and cfg.rollout.seed == 7 and cfg.tags == ("a", "b")
    assert build(Config, {"rollout": {"seed": 3}}, ["rollout.seed=null"]).rollout.seed is None


def test_overrides_do_not_mutate_the_callers_data():
    data = {"rollout": {"max_new_tokens": 8}}
    build(Config, data, ["rollout.max_new_tokens=9"])
    assert data == {"rollout": {"max_new_tokens": 8}}


def test_an_override_without_equals_sign_is_an_error():
    msg = "override 'rollout.max_new_tokens' is not of the form a.b.c=value"
    assert error({}, ["rollout.max_new_tokens"]) == msg


def test_an_override_cannot_descend_into_a_value():
    msg = "cannot set 'name.first': 'name' is a value, not a section"
    assert error({"name": "a"}, ["name.first=x"]) == msg
    msg = "'name' must be str, got a mapping (it is a value, not a section)"
    assert error({}, ["name.first=x"]) == msg  # no YAML value: the override makes a mapping


# --- types ----------------------------------------------------------------------------------------


def test_an_int_is_accepted_for_a_float_and_becomes_a_float():
    cfg = build(Config, {"rollout": {"temperature": 1}})
    assert cfg.rollout.temperature == 1.0 and type(cfg.rollout.temperature) is float


def test_a_float_written_without_a_dot_is_read_as_a_float(tmp_path):
    assert yaml.safe_load("lr: 1e-4") == {"lr": "1e-4"}  # why the loader converts strings
    assert load(Config, write(tmp_path, "optim:\n  lr: 1e-4\n")).optim.lr == 1e-4
    assert build(Config, {}, ["optim.betas=[9e-1, 1]"]).optim.betas == (0.9, 1.0)


def test_a_non_numeric_string_is_not_a_float():
    assert error({}, ["optim.lr=fast"]) == "'optim.lr' must be float, got str 'fast'"


def test_a_bool_is_not_an_int_and_an_int_is_not_a_bool():
    msg = "'rollout.max_new_tokens' must be int, got bool True"
    assert error({}, ["rollout.max_new_tokens=true"]) == msg
    assert error({"use_wandb": 1}) == "'use_wandb' must be bool, got int 1"


def test_a_float_is_not_an_int_and_a_number_is_not_a_str():
    assert error({"max_staleness": 2.5}) == "'max_staleness' must be int, got float 2.5"
    assert error({}, ["name=7"]) == "'name' must be str, got int 7"


def test_a_list_becomes_a_tuple_and_its_items_are_checked():
    assert build(Config, {"rollout": {"stage_sizes": [1, 2]}}).rollout.stage_sizes == (1, 2)
    msg = "'rollout.stage_sizes[1]' must be int, got str 'x'"
    assert error({"rollout": {"stage_sizes": [1, "x"]}}) == msg
    msg = "'rollout.stage_sizes' must be a list (tuple[int, ...]), got int 4"
    assert error({"rollout": {"stage_sizes": 4}}) == msg


def test_a_value_outside_a_literal_lists_the_choices():
    msg = "'rollout.policy' must be one of 'grpo', 'ar3po', 'aero'; got str 'ppo'"
    assert error({}, ["rollout.policy=ppo"]) == msg


def test_an_optional_takes_null_or_its_type():
    assert build(Config, {"rollout": {"seed": None}}).rollout.seed is None
    assert error({"rollout": {"seed": "abc"}}) == "'rollout.seed' must be int, got str 'abc'"


def test_a_section_given_a_scalar_and_a_scalar_given_a_mapping_are_errors():
    assert error({"rollout": 5}) == "'rollout' is a section: give it a mapping, not int 5"
    msg = "'name' must be str, got a mapping (it is a value, not a section)"
    assert error({"name": {"first": "x"}}) == msg


def test_a_required_field_without_a_value_is_named():
    @dataclass(frozen=True)
    class Needs:
        model: str

    assert error({}, cls=Needs) == "missing required config key 'model'"
    assert build(Needs, {"model": "m"}) == Needs("m")


# --- unknown keys ---------------------------------------------------------------------------------


def test_an_unknown_key_names_the_full_key_and_the_nearest_valid_one():
    assert error({}, ["rollout.max_new_token=5"]) == (
        "unknown config key 'rollout.max_new_token'; did you mean 'rollout.max_new_tokens'?")


def test_a_key_in_the_wrong_section_suggests_where_it_lives():
    msg = "unknown config key 'temperature'; did you mean 'rollout.temperature'?"
    assert error({"temperature": 0.5}) == msg


def test_an_unknown_section_is_named_and_suggested():
    msg = "unknown config key 'rollot'; did you mean 'rollout'?"
    assert error({"rollot": {"max_new_tokens": 5}}) == msg


def test_an_unknown_key_with_nothing_near_lists_the_valid_keys():
    msg = "unknown config key 'optim.zzz'; valid keys here: lr, clip_low, clip_high, betas"
    assert error({"optim": {"zzz": 1}}) == msg


def test_every_problem_is_reported_at_once():
    lines = error({"mode": "fast", "rollout": {"max_new_tokens": "many"}}, ["x"]).splitlines()
    assert lines[0] == "override 'x' is not of the form a.b.c=value"
    assert lines[1].startswith("'mode' must be one of") and len(lines) == 3
    assert lines[2] == "'rollout.max_new_tokens' must be int, got str 'many'"


# --- validate() hooks -----------------------------------------------------------------------------


def test_a_section_validate_hook_error_is_prefixed_with_its_key_path():
    msg = "optim: clip_high (0.1) must be >= clip_low (0.2)"
    assert error({}, ["optim.clip_high=0.1"]) == msg


def test_the_top_level_validate_hook_runs_after_the_sections():
    assert error({"max_staleness": 2}) == "mode 'sync' needs max_staleness 0"
    assert build(Config, {"mode": "async", "max_staleness": 2}).max_staleness == 2


def test_build_prefixes_keys_with_where():
    with pytest.raises(ConfigError, match="^optim: clip_high"):
        build(Optim, {"clip_high": 0.0}, where="optim")
    with pytest.raises(ConfigError, match="unknown config key 'optim.l'"):
        build(Optim, {"l": 0.0}, where="optim")


# --- files ----------------------------------------------------------------------------------------


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "name: a\nrollout:\n  max_new_tokens: [1, 2\n")
    where = re.escape(f"YAML syntax error in {path}, line 4, column")
    with pytest.raises(ConfigError, match=where):
        load(Config, path)


def test_the_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="the top level must be a mapping of keys, got list"):
        load(Config, write(tmp_path, "- a\n- b\n"))


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(Config, tmp_path / "nope.yaml")


def test_dump_then_load_gives_an_equal_config(tmp_path):
    cfg = build(Config, {"mode": "async", "max_staleness": 2, "tags": ["x", "yes", "é\x85\u2028"]},
                ["rollout.stage_sizes=[2,2,4]", "optim.lr=1e-4", "rollout.seed=3"])
    dump(cfg, tmp_path / "config.yaml")
    assert load(Config, tmp_path / "config.yaml") == cfg
    assert to_dict(cfg)["rollout"]["stage_sizes"] == [2, 2, 4]  # tuples are written as lists


# --- docs -----------------------------------------------------------------------------------------


def test_field_docs_reads_the_string_under_each_field():
    docs = field_docs(Config)
    assert docs["name"] == "Run name: the folder under runs/."
    assert docs["rollout"] == "How actors sample."
    assert docs["rollout.max_new_tokens"] == "Tokens to generate per response."
    assert docs["rollout.stage_sizes"] == "AR3PO: responses per stage,\nin order."
    assert docs["optim.lr"] == "Learning rate."
    assert "optim.clip_low" not in docs and "mode" not in docs  # no string, no doc


def test_describe_lists_every_key_with_type_default_and_doc():
    text = describe(Config)
    assert "rollout.max_new_tokens: int = 512\n    Tokens to generate per response." in text
    assert "rollout.policy: 'grpo' | 'ar3po' | 'aero' = grpo" in text
    assert "rollout.stage_sizes: tuple[int, ...] = [4, 4]" in text
    assert "rollout.seed: int | None = null" in text
    assert "optim.lr: float = 3.0e-06" in text  # the parent's default instance, not Optim()'s
    assert "rollout:  [section Rollout]\n    How actors sample." in text


# --- property -------------------------------------------------------------------------------------

printable = st.text(alphabet=string.printable, max_size=20)
finite = st.floats(allow_nan=False, allow_infinity=True)
valid_data = st.fixed_dictionaries(
    {"mode": st.sampled_from(["async", "staged"])},  # sync would need max_staleness 0
    optional={
        "name": printable,
        "max_staleness": st.integers(-(2**70), 2**70),
        "use_wandb": st.booleans(),
        "tags": st.lists(st.text(max_size=8), max_size=3),
        "rollout": st.fixed_dictionaries(
            {},
            optional={
                "max_new_tokens": st.integers(0, 10**6),
                "temperature": finite | st.integers(-100, 100),
                "policy": st.sampled_from(["grpo", "ar3po", "aero"]),
                "stage_sizes": st.lists(st.integers(0, 64), max_size=5),
                "seed": st.none() | st.integers(0, 2**31),
            },
        ),
        "optim": st.fixed_dictionaries(
            {"clip_low": st.just(0.2), "clip_high": st.floats(0.2, 10)},
            optional={"lr": finite, "betas": st.lists(finite, max_size=3)},
        ),
    },
)


@settings(max_examples=60, deadline=None)
@given(valid_data)
def test_dump_of_load_round_trips_for_any_valid_config(data):
    with tempfile.TemporaryDirectory() as tmp:
        source, resolved = Path(tmp) / "in.yaml", Path(tmp) / "out.yaml"
        source.write_text(yaml.safe_dump(data))
        cfg = load(Config, source)
        dump(cfg, resolved)
        again = load(Config, resolved)
    assert again == cfg and to_dict(again) == to_dict(cfg)


def test_an_unquoted_off_is_the_choice_off_where_a_choice_is_spelled_so(tmp_path):
    # YAML 1.1 reads `off` as False: `ar3po.reuse_mode=off` and `reuse_mode: off` mean 'off'
    from protocol.config import Config, load_config

    path = tmp_path / "c.yaml"
    path.write_text("algorithm: ar3po\nar3po:\n  reuse_mode: off\n")
    assert load_config(path).ar3po.reuse_mode == "off"
    assert load_config(path, ["mugrpo.veto_scope=off", "ar3po.reuse_mode=off"]).mugrpo.veto_scope \
        == "off"
    with pytest.raises(ConfigError, match="'mode' must be one of"):  # no 'off' there: refused
        build(Config, {}, ["mode=off"])
