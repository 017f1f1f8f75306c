"""The values a run config refuses: anything that would do nothing, hang or divide by zero.

Where the rules live: beside the keys. Every section class (protocol/config/run.py, model.py,
task.py, rollout.py, training.py, actors.py, algorithms.py) has `problems(cfg)`, the values of
its keys that cannot work, each message naming its dotted key, also where the rule reads
another section (weight_sync.sync_every against max_staleness); the top-level keys' are
`Config.problems` (__init__.py). Here: `value_problems(cfg)` gathers them all, and
`Config.validate` raises them at once, so `rlvr train` stops before any process starts;
`positive` and `non_negative` are the sections' shared bounds; `RENAMED_VALUES` are old
spellings of a value that a user's YAML may still hold, refused naming the new one;
`config_warnings` are settings that work but bias the data.

Every function takes the run's `protocol.config.Config` as `cfg`, untyped here: the package's
__init__.py imports this module (as every section module does), and this one imports none of
them.

Run the tests with: .venv/bin/python -m pytest tests/test_config_checks.py
"""

from __future__ import annotations

import dataclasses
import math

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


def positive(values: dict[str, float]) -> list[str]:
    """Messages for the keys in `values` (dotted key -> value) that are not > 0 and finite."""
    return _bounded(values, "> 0", lambda v: v <= 0)


def non_negative(values: dict[str, float]) -> list[str]:
    """Messages for the keys in `values` that are not >= 0 and finite."""
    return _bounded(values, ">= 0", lambda v: v < 0)


def _bounded(values: dict[str, float], what: str, out_of_range) -> list[str]:
    return [f"'{key}' must be {what}, got {value}" for key, value in values.items()
            if value is None or out_of_range(value)
            or (isinstance(value, float) and not math.isfinite(value))]


def value_problems(cfg) -> list[str]:
    """Every value of `cfg` that would do nothing, hang or divide by zero (messages name keys):
    the top-level keys' (`Config.problems`), then each section's (its `problems(cfg)`, beside
    the keys it holds)."""
    found = cfg.problems(cfg)
    for section in sections(cfg):
        if hasattr(section, "problems"):
            found += section.problems(cfg)
    return found


def sections(cfg) -> list:
    """The sections of `cfg` in the tree's order (`run`, `model`, ..., the algorithms')."""
    return [getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if dataclasses.is_dataclass(getattr(cfg, f.name))]


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
