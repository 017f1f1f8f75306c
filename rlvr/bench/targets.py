"""The targets `rlvr bench` reports: each a rule, the value measured, and whether it is met.

A target is met, missed, or None when a number it needs is missing (a run that failed, a mode
not run): never a silent pass.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from rlvr.bench.run_metrics import is_number, ratio

_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le,
                                                    "<": operator.lt, ">": operator.gt}


def target(rule: str, value: float | None, op: str, threshold: float | None) -> dict:
    """One target: met (True/False, None when a number is missing), the value and threshold."""
    met = None
    if is_number(value) and is_number(threshold):
        met = bool(_OPS[op](value, threshold))
    return {"met": met, "value": value, "op": op, "threshold": threshold, "rule": rule}


def efficiency_targets(algorithms: dict[str, dict], reduction_vs_dapo: float | None) -> dict:
    def final(name: str) -> float | None:
        return algorithms.get(name, {}).get("eval_avg@8", {}).get("mean")

    dapo, grpo = final("dapo"), final("grpo")
    out = {}
    if "ar3po_abort" in algorithms and "ar3po" in algorithms:  # abort on first correct
        def per_prompt(name: str) -> float | None:
            return algorithms[name].get("gen_tokens_per_trained_prompt", {}).get("mean")

        off = final("ar3po")
        out["ar3po_abort_fewer_tokens_per_trained_prompt"] = target(
            "ar3po_abort tokens/trained prompt < ar3po's", per_prompt("ar3po_abort"), "<",
            per_prompt("ar3po"))
        out["ar3po_abort_accuracy_within_2pt"] = target(
            "ar3po_abort final eval/avg@8 >= ar3po's - 0.02", final("ar3po_abort"), ">=",
            off - 0.02 if is_number(off) else None)
    return out | {
        "ar3po_4x_fewer_responses_than_dapo": target(
            "dapo responses/step / ar3po responses/step >= 4", reduction_vs_dapo, ">=", 4.0),
        "ar3po_accuracy_within_2pt_of_dapo": target(
            "ar3po final eval/avg@8 >= dapo's - 0.02", final("ar3po"), ">=",
            dapo - 0.02 if is_number(dapo) else None),
        "ar3po_accuracy_at_least_grpo": target(
            "ar3po final eval/avg@8 >= grpo's", final("ar3po"), ">=", grpo),
    }


def throughput_targets(modes: dict[str, dict], bound: float | None, async_mode: str,
                       sync_mode: str = "sync") -> dict:
    a, s = modes.get(async_mode, {}), modes.get(sync_mode, {})
    speedup = ratio(a.get("steps_per_min"), s.get("steps_per_min"))
    sync_acc = s.get("eval_avg@8")
    out = {}
    finish = modes.get("async_s2_finish", {}).get("learner_wait_s_per_sync")
    for policy in ("continue", "abort", "recompute"):  # the in-flight update policies (8.1)
        if f"async_s2_{policy}" in modes and "async_s2_finish" in modes:
            out[f"learner_wait_{policy}_5x_below_finish"] = target(
                f"learner wait per sync: async_s2_finish / async_s2_{policy} >= 5",
                ratio(finish, modes[f"async_s2_{policy}"].get("learner_wait_s_per_sync")),
                ">=", 5.0)
    base, on_actors = modes.get("async_s2", {}), modes.get("async_s2_eval_actors", {})
    if base and on_actors:
        slowdown = ratio(on_actors.get("steps_per_min"), base.get("steps_per_min"))
        share = on_actors.get("eval_tokens_share")
        out["eval_on_actors_costs_its_token_share"] = target(
            "async_s2_eval_actors steps/min / async_s2's >= 1 - the evaluation's token share",
            slowdown, ">=", 1.0 - share if is_number(share) else None)
        # the learner's idle share must not grow: it trains on while the actors evaluate
        out["eval_on_actors_learner_busy"] = target(
            "learner busy fraction: async_s2_eval_actors >= async_s2's",
            on_actors.get("learner_busy_frac"), ">=", base.get("learner_busy_frac"))
    return out | {
        "async_fraction_of_overlap_bound": target(
            f"{async_mode} speedup / overlap bound >= 0.9", ratio(speedup, bound), ">=", 0.9),
        "async_speedup_vs_sync": target(
            f"{async_mode} steps/min / sync steps/min >= 1.1", speedup, ">=", 1.1),
        "async_accuracy_within_3pt_of_sync": target(
            f"{async_mode} final eval/avg@8 >= sync's - 0.03", a.get("eval_avg@8"), ">=",
            sync_acc - 0.03 if is_number(sync_acc) else None),
        "async_learner_busy": target(
            f"{async_mode} learner busy fraction >= 0.85", a.get("learner_busy_frac"), ">=", 0.85),
    }
