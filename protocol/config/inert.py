"""Keys that do nothing: set where the rest of the config never reads them (refused when a run
starts), or removed from the schema (refused in a user's YAML, dropped from a run folder written
before they went).

Where the rules live: beside the keys, as `inert(cfg)` of the section that holds them
(rollout.py, training.py's loss, algorithms.py's ar3po and gcpo) and `Config.inert` for the
top-level staleness keys. Here: `inert_keys(cfg)` gathers (key, message) for every key set away
from its default where the config cannot act on it; `load_config` raises them for a new run
and lets a run folder through (__init__.py). `neutral_overrides(cfg)` sets those keys back to
their defaults, for tools that run one YAML under several modes or algorithms (`rlvr bench`,
`rlvr sweep`). `REMOVED_KEYS` are keys the schema no longer has, with the reason.
Apart from checks.py's values because these rules are relaxed for run folders.

Every function takes the run's `protocol.config.Config` as `cfg`, untyped here: the package's
__init__.py imports this module, and this one does not import it back.

Run the tests with: .venv/bin/python -m pytest tests/test_config_checks.py tests/test_every_key.py
"""

from __future__ import annotations



# dotted key -> why it is gone; refused with that reason rather than as an unknown key
REMOVED_KEYS: dict[str, str] = {
    "aero.negative_pick": "it had one value and was read nowhere: AERO's kept negatives are "
                          "always uniformly random (4.4's 'most informative' states no criterion)",
}


def removed_key_problems(data: dict, overrides) -> list[str]:
    """Messages for keys that no longer exist, set in the YAML `data` or an override."""
    found = []
    for key, why in REMOVED_KEYS.items():
        *sections, name = key.split(".")
        node = _section(data, sections)
        if name in node or any(t.partition("=")[0].strip() == key for t in overrides):
            found.append(f"'{key}' was removed: {why}; delete it")
    return found


def without_removed_keys(data: dict) -> dict:
    """A copy of `data` (nested dicts) without the removed keys: a run folder written before
    they went."""
    import copy

    out = copy.deepcopy(data)
    for key in REMOVED_KEYS:
        *sections, name = key.split(".")
        _section(out, sections).pop(name, None)
    return out


def _section(data: dict, path: list[str]) -> dict:
    """The nested dict at `path` in `data`, or an empty one where there is none."""
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def inert_problems(cfg) -> list[str]:
    """Messages for keys set away from their default where the rest of the config never reads
    them (the run would silently do what it does without them)."""
    return [message for _, message in inert_keys(cfg)]


def neutral_overrides(cfg) -> list[str]:
    """Overrides that put every inert key back to its default: what a tool that runs one YAML
    under several modes or algorithms (`rlvr bench`) adds to each variant."""
    import json

    from protocol.config.loader import to_dict

    defaults = to_dict(type(cfg)())
    out = []
    for key, _ in inert_keys(cfg):
        value = defaults
        for part in key.split("."):
            value = value[part]
        out.append(f"{key}={json.dumps(value)}")  # JSON is YAML
    return list(dict.fromkeys(out))


def inert_keys(cfg) -> list[tuple[str, str]]:
    """(key, message) for keys set away from their default where the rest of the config never
    reads them: the top-level keys' (`Config.inert`), then each section's that has such rules
    (`inert(cfg)`, beside its keys). Refused when a run starts (`load_config`); a run folder
    resumed under newer rules is let through (`run_folder=True`)."""
    from protocol.config.checks import sections

    found = cfg.inert(cfg)
    for section in sections(cfg):
        if hasattr(section, "inert"):
            found += section.inert(cfg)
    return found
