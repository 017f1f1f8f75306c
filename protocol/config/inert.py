"""Keys that do nothing: set where the rest of the config never reads them (refused when a run
starts), or removed from the schema (refused in a user's YAML, dropped from a run folder written
before they went).

What: `inert_keys(cfg)` lists (key, message) for every key set away from its default where the
config cannot act on it; `load_config` raises them for a new run and lets a run folder through
(protocol/config/__init__.py). `neutral_overrides(cfg)` sets those keys back to their defaults,
for tools that run one YAML under several modes or algorithms (`rlvr bench`, `rlvr sweep`).
`REMOVED_KEYS` are keys the schema no longer has, with the reason.
Why a module of its own: checks.py refuses values that cannot work whatever the
rest of the config says; these rules are about one key against the others, and they are relaxed
for run folders.

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
    reads them. Refused when a run starts (`load_config`); a run folder resumed under newer
    rules is let through (`run_folder=True`)."""
    return [*_inert_staleness(cfg), *_inert_rollout(cfg), *_inert_loss(cfg),
            *_inert_gcpo_reuse(cfg)]


def _inert_staleness(cfg) -> list[tuple[str, str]]:
    """The staleness keys a mode fixes, and the downweight of another stale_policy."""
    defaults = type(cfg)  # the Config class, whose attributes are the defaults
    found = []
    fixed = {"sync": "0", "staged": "mugrpo.updates_per_stage - 1"}.get(cfg.mode)
    if fixed and cfg.max_staleness not in (defaults.max_staleness, cfg.staleness.bound):
        found.append(("max_staleness", f"'max_staleness' ({cfg.max_staleness}) does nothing in "
                      f"mode {cfg.mode}: its staleness bound is {fixed} ({cfg.staleness.bound})"))
    if fixed and cfg.stale_policy != defaults.stale_policy:
        found.append(("stale_policy", f"'stale_policy' ({cfg.stale_policy}) does nothing in mode "
                      f"{cfg.mode}: no group comes back staler than the bound, which the mode "
                      "fixes"))
    if cfg.stale_downweight != defaults.stale_downweight and (
            cfg.stale_policy != "downweight" or fixed):
        found.append(("stale_downweight", f"'stale_downweight' ({cfg.stale_downweight}) acts only "
                      f"under stale_policy downweight in mode async (got {cfg.stale_policy}, "
                      f"mode {cfg.mode})"))
    return found


def _inert_rollout(cfg) -> list[tuple[str, str]]:
    """Work-item size under determinism, the group size of policies that spend their own."""
    from protocol.config.sections import RolloutConfig

    found, r = [], cfg.rollout
    if cfg.run.deterministic and r.prompts_per_work != RolloutConfig.prompts_per_work:
        found.append(("rollout.prompts_per_work", f"'rollout.prompts_per_work' "
                      f"({r.prompts_per_work}) does nothing under run.deterministic: each actor "
                      "takes its share of a generation round in one work item "
                      f"({cfg.work_size} prompts)"))
    if r.group_size != RolloutConfig.group_size and r.policy in ("stop_on_correct", "aero"):
        spends = "ar3po.stage_sizes" if r.policy == "stop_on_correct" else "aero.n_*"
        found.append(("rollout.group_size", f"'rollout.group_size' ({r.group_size}) is unused by "
                      f"rollout.policy {r.policy}, which spends {spends} per prompt"))
    return found


def _inert_loss(cfg) -> list[tuple[str, str]]:
    """The behaviour weight's knobs, the trust region's other knobs, the KL kind without KL."""
    from protocol.config.sections import LossConfig

    found, loss = [], cfg.loss
    if loss.old_policy == "behaviour":
        for key in ("behav_weight_cap", "behav_weight_mode"):
            if getattr(loss, key) != getattr(LossConfig, key):
                found.append((f"loss.{key}", f"'loss.{key}' ({getattr(loss, key)}) does nothing "
                              "under loss.old_policy behaviour: the ratio is to the behaviour "
                              "policy itself and w = 1"))
    elif loss.behav_weight_mode == "off" and loss.behav_weight_cap != LossConfig.behav_weight_cap:
        found.append(("loss.behav_weight_cap", f"'loss.behav_weight_cap' ({loss.behav_weight_cap}) "
                      "does nothing with loss.behav_weight_mode off (w = 1)"))
    if loss.trust_region == "m2po":
        for key in ("clip_low", "clip_high", "dual_clip"):
            if getattr(loss, key) != getattr(LossConfig, key):
                found.append((f"loss.{key}", f"'loss.{key}' ({getattr(loss, key)}) does nothing "
                              "with loss.trust_region m2po: M2PO masks tokens instead of "
                              "clipping the ratio"))
    elif loss.m2po_tau != LossConfig.m2po_tau:
        found.append(("loss.m2po_tau", f"'loss.m2po_tau' ({loss.m2po_tau}) does nothing with "
                      "loss.trust_region clip"))
    if loss.kl_beta == 0 and loss.kl_kind != LossConfig.kl_kind:
        found.append(("loss.kl_kind", f"'loss.kl_kind' ({loss.kl_kind}) does nothing with "
                      "loss.kl_beta 0 (no KL term)"))
    return found


def _inert_gcpo_reuse(cfg) -> list[tuple[str, str]]:
    """GCPO's other form's knob; AR3PO's reuse buffer with reuse off or read only at its end."""
    from protocol.config.algorithms import AR3POConfig, GCPOConfig

    found, ar = [], cfg.ar3po
    gc = cfg.gcpo
    form_key = {"gated": "beta_c", "logsigmoid": "eps_c"}[gc.form]  # the other form's knob
    if getattr(gc, form_key) != getattr(GCPOConfig, form_key):
        found.append((f"gcpo.{form_key}", f"'gcpo.{form_key}' ({getattr(gc, form_key)}) does "
                      f"nothing with gcpo.form {gc.form}"))
    if ar.reuse_mode == "off":
        for key in ("buffer_size", "buffer_pick"):
            if getattr(ar, key) != getattr(AR3POConfig, key):
                found.append((f"ar3po.{key}", f"'ar3po.{key}' ({getattr(ar, key)}) does nothing "
                              "with ar3po.reuse_mode off: no response is reused"))
    elif ar.buffer_pick == "latest" and ar.buffer_size != AR3POConfig.buffer_size:
        found.append(("ar3po.buffer_size", f"'ar3po.buffer_size' ({ar.buffer_size}) does nothing "
                      "with ar3po.buffer_pick latest, which reads only the newest entry (uniform "
                      "picks among them)"))
    return found
