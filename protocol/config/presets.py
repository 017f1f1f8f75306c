"""Algorithm presets: what `algorithm=<name>` means, as plain config data.

A preset is the default values of one algorithm's rollout policy, reuse, curation and loss.
`load_config` merges it UNDER the YAML file and the command-line overrides, so every key the user
writes wins: `algorithm=ar3po ar3po.stage_sizes=[2,2,4]` is AR3PO with three stages, and
`algorithm=hora loss.advantage=rloo` is HORA allocation with an RLOO advantage. The resolved
config (every key explicit) is what the run folder keeps, so a resumed run never re-applies one.

    python -c "from protocol.config.presets import preset; print(preset('dapo'))"
"""

from __future__ import annotations

ALGORITHMS = ("grpo", "dapo", "drgrpo", "rloo", "ar3po", "aero", "hora", "mugrpo", "gcpo")


def preset(name: str) -> dict:
    """Default config values of algorithm `name` (docs/ALGORITHMS.md sections in the comments).
    An unknown name gives {} and fails where `algorithm` is checked, naming the choices."""
    match name:
        case "grpo":  # 2: fixed N, mean/std advantage, symmetric clip
            return {"rollout": {"policy": "fixed"}, "loss": {"advantage": "grpo"}}
        case "dapo":  # 2: clip-higher, token-mean, dynamic sampling, -1/1 reward, overlong shaping
            return {"rollout": {"policy": "fixed"},
                    "dapo": {"dynamic_sampling": True, "signed_reward": True,
                             "overlong": "shaping"},
                    "loss": {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token-mean"}}
        case "drgrpo":  # 2: no std division, no 1/|o| (constant normaliser)
            return {"rollout": {"policy": "fixed"},
                    "loss": {"advantage": "drgrpo", "aggregation": "seq-mean-token-sum-norm"}}
        case "rloo":  # 2: leave-one-out baseline inside the clipped surrogate
            return {"rollout": {"policy": "fixed"}, "loss": {"advantage": "rloo"}}
        case "ar3po":  # 3: staged stop-on-first-correct rollout + advantage-only reuse
            return {"rollout": {"policy": "stop_on_correct"},
                    "ar3po": {"reuse_mode": "advantage_only"}}
        case "aero":  # 4: explore + rescue from a budget pooled over the step (one work item)
            return {"rollout": {"policy": "aero", "prompts_per_work": None},
                    "aero": {"curate": True},
                    "loss": {"std_mode": "population", "entropy_coef": 1e-3}}
        case "hora":  # 7: greedy hit-utility allocation of a step's budget (one work item)
            return {"rollout": {"policy": "hora", "prompts_per_work": None}}
        case "mugrpo":  # 5: staged schedule, ratio to behaviour, relaxed clip [0, 5], veto
            return {"mode": "staged", "mugrpo": {"veto_scope": "suffix"},
                    "loss": {"old_policy": "behaviour", "clip_low": 1.0, "clip_high": 4.0,
                             "aggregation": "token-mean"}}
        case "gcpo":  # 6: contrastive term with a golden trajectory on all-fail groups
            return {"gcpo": {"coef": 1.0}}
        case _:
            return {}


def merge_under(defaults: dict, data: dict) -> dict:
    """`data` with `defaults` filled in where it has no key; sections merge key by key, and a
    section written empty (`loss:` with nothing under it) takes the defaults. New dicts only."""
    out = dict(defaults)
    for key, value in data.items():
        below = defaults.get(key)
        if isinstance(below, dict) and (value is None or isinstance(value, dict)):
            out[key] = merge_under(below, value or {})
        else:
            out[key] = value
    return out
