"""Pure reductions behind `rlvr bench`: metric rows in, benchmark numbers out.

Everything here is a function of plain lists and dicts (rows as `learner.run_log.read_metrics`
returns them: one dict per learner step, step 0 being the evaluation before training), so the
arithmetic of every number in a results.json is unit tested on synthetic rows
(tests/test_bench_math.py) apart from the runs that produce it.

Conventions:
  - a missing or non-finite value is None, never 0, and propagates as None;
  - "training rows" are steps >= 1; step 0 only carries the evaluation before training;
  - spread over seeds is the sample standard deviation (n - 1), 0.0 with one seed;
  - accuracies are fractions in [0, 1]; "points" in the targets are hundredths (0.02 = 2 points).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

EVAL_AVG, EVAL_PASS = "eval/avg@8", "eval/pass@8"


# ---------------------------------------------------------------------------------------------
# Rows and series
# ---------------------------------------------------------------------------------------------


def is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def training_rows(rows: list[dict]) -> list[dict]:
    """Rows of optimizer steps (step >= 1), in step order."""
    return sorted((r for r in rows if isinstance(r.get("step"), int) and r["step"] >= 1),
                  key=lambda r: r["step"])


def values(rows: Iterable[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if is_number(r.get(key))]


def mean(xs: Iterable[float | None]) -> float | None:
    xs = [x for x in xs if is_number(x)]
    return sum(xs) / len(xs) if xs else None


def total(xs: Iterable[float | None]) -> float | None:
    xs = [x for x in xs if is_number(x)]
    return float(sum(xs)) if xs else None


def mean_std(xs: Iterable[float | None]) -> dict:
    """{"mean", "std", "n"} over the finite values; std is the sample std (0.0 for one value)."""
    xs = [float(x) for x in xs if is_number(x)]
    if not xs:
        return {"mean": None, "std": None, "n": 0}
    m = sum(xs) / len(xs)
    std = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"mean": m, "std": std, "n": len(xs)}


def last_value(rows: list[dict], key: str) -> float | None:
    found = values(rows, key)
    return found[-1] if found else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not is_number(numerator) or not is_number(denominator) or denominator == 0:
        return None
    return numerator / denominator


def step_gen_tokens(row: dict) -> float | None:
    """Tokens generated for this step's groups: `gen/tokens`, or mean length x responses on
    runs logged before that metric existed."""
    if is_number(row.get("gen/tokens")):
        return float(row["gen/tokens"])
    if is_number(row.get("resp/len_mean")) and is_number(row.get("gen/responses_per_step")):
        return row["resp/len_mean"] * row["gen/responses_per_step"]
    return None


def step_trained_prompts(row: dict) -> int | None:
    """Prompts (groups) whose responses reached this step's loss."""
    ids = row.get("groups/trained_ids")
    return len(ids) if isinstance(ids, list) else None


def tokens_per_trained_prompt(rows: list[dict]) -> float | None:
    """Tokens generated (aborted partial responses included) per prompt that was trained on."""
    return ratio(total(step_gen_tokens(r) for r in rows),
                 total(step_trained_prompts(r) for r in rows))


def step_train_tokens(row: dict) -> float | None:
    """Response tokens in the step's loss: the update's tokens/s times its compute seconds."""
    rate, seconds = row.get("perf/train_tokens_per_s"), row.get("timing/update")
    return rate * seconds if is_number(rate) and is_number(seconds) else None


# ---------------------------------------------------------------------------------------------
# Efficiency: responses generated, and what they buy
# ---------------------------------------------------------------------------------------------


def accuracy_by_responses(rows: list[dict], key: str = EVAL_AVG) -> list[tuple[int, float, float]]:
    """(step, responses generated up to and including that step, accuracy) at each evaluation,
    the one before training (step 0, no responses yet) included. Every generated group counts,
    DAPO-filtered ones too; the evaluation's own samples do not."""
    generated, points = 0.0, []
    for row in sorted(rows, key=lambda r: r.get("step", -1)):
        if row.get("step", 0) >= 1 and is_number(row.get("gen/responses_per_step")):
            generated += row["gen/responses_per_step"]
        if is_number(row.get(key)):
            points.append((row["step"], generated, float(row[key])))
    return points


def first_reach(rows: list[dict], key: str, target: float) -> dict | None:
    """The first evaluation where `key` >= `target`: its step and the responses generated until
    then. None when no evaluation reached it."""
    for step, responses, acc in accuracy_by_responses(rows, key):
        if acc >= target:
            return {"step": step, "responses": responses}
    return None


def run_efficiency(rows: list[dict], target_acc: float | None) -> dict:
    """One run's sample cost and accuracy (docs/ALGORITHMS.md 3.7: whole-run mean and last-10% mean
    of responses per step; reused responses are never counted, the learner logs fresh ones)."""
    train = training_rows(rows)
    tail = train[-max(1, math.ceil(len(train) / 10)):] if train else []
    reached = first_reach(rows, EVAL_AVG, target_acc) if target_acc is not None else None
    times = values(sorted(rows, key=lambda r: r.get("step", -1)), "time_s")
    evals = sorted((r for r in rows if is_number(r.get(EVAL_AVG))), key=lambda r: r.get("step", -1))
    return {
        "steps": len(train),
        "responses_per_step": mean(values(train, "gen/responses_per_step")),
        "responses_per_step_last10pct": mean(values(tail, "gen/responses_per_step")),
        "responses_per_prompt": mean(values(train, "gen/responses_per_prompt")),
        "responses_per_trained_prompt": mean(values(train, "gen/responses_per_trained_prompt")),
        "total_responses": total(values(train, "gen/responses_per_step")),
        "total_gen_tokens": total(step_gen_tokens(r) for r in train),
        "gen_tokens_per_trained_prompt": tokens_per_trained_prompt(train),
        "aborted_tokens": total(values(train, "gen/aborted_tokens")),
        "responses_to_target": reached["responses"] if reached else None,
        "steps_to_target": reached["step"] if reached else None,
        "eval_avg@8_initial": evals[0][EVAL_AVG] if evals and evals[0].get("step") == 0 else None,
        "eval_avg@8": last_value(training_rows(evals), EVAL_AVG),
        "eval_pass@8": last_value(training_rows(rows), EVAL_PASS),
        # training time: from the end of the evaluation before training to the last step
        "wall_s": times[-1] - times[0] if len(times) > 1 else None,
    }


def combine_seeds(per_seed: list[dict]) -> dict:
    """Each numeric field of `run_efficiency` as {"mean", "std", "n"} over seeds; how many
    seeds reached the target is `reached_target` (the to-target means are over those only)."""
    keys = [k for k in per_seed[0] if k != "steps"] if per_seed else []
    out = {k: mean_std(s.get(k) for s in per_seed) for k in keys}
    out["reached_target"] = sum(s.get("responses_to_target") is not None for s in per_seed)
    out["seeds"] = len(per_seed)
    return out


def default_target_acc(final_means: dict[str, float | None]) -> float | None:
    """The lowest of the algorithms' mean final eval/avg@8: an accuracy every algorithm attains
    by the end on average, so "responses until it is first reached" compares paths to one
    place. A fixed `--target-acc` replaces it."""
    finals = [v for v in final_means.values() if is_number(v)]
    return min(finals) if finals else None


def reductions(algorithms: dict[str, dict], baselines: tuple[str, ...] = ("dapo", "grpo")) -> dict:
    """Per algorithm, baseline responses per step / its own (mean over seeds): "4.0" means the
    algorithm generated four times fewer responses per step than that baseline."""
    def per_step(name: str) -> float | None:
        entry = algorithms.get(name, {}).get("responses_per_step", {})
        return entry.get("mean") if isinstance(entry, dict) else None

    return {name: {f"vs_{b}": ratio(per_step(b), per_step(name)) for b in baselines}
            for name in algorithms}


# ---------------------------------------------------------------------------------------------
# Throughput: steps per minute, busy fractions, and the overlap bound
# ---------------------------------------------------------------------------------------------


def steady_window(rows: list[dict], skip_first: int = 1) -> list[dict]:
    """Training rows without the first `skip_first` steps (pipeline fill: the first batch is
    generated while nothing can overlap it) and the last step (the final evaluation and
    checkpoint). Falls back to every training row when too few are left."""
    train = training_rows(rows)
    window = train[skip_first:-1]
    return window if window else train


def step_busy_s(row: dict) -> float | None:
    """The learner's own work in a step: step time less its wait for groups and any
    evaluation inside it (evaluation is not part of the training loop's throughput)."""
    step, idle = row.get("perf/step_time"), row.get("perf/learner_idle_s")
    if not is_number(step) or not is_number(idle):
        return None
    return step - idle - (row["timing/eval"] if is_number(row.get("timing/eval")) else 0.0)


def window_seconds(rows: list[dict]) -> float | None:
    """Wall seconds of these steps, evaluations inside them excluded."""
    spans = [r["perf/step_time"] - (r["timing/eval"] if is_number(r.get("timing/eval")) else 0.0)
             for r in rows if is_number(r.get("perf/step_time"))]
    return sum(spans) if spans else None


def run_throughput(rows: list[dict], actors: int, skip_first: int = 1) -> dict:
    """One run's rates over its steady window. G = the learner's mean wait for a step's groups,
    T = its mean own work per step (update, weight sync, bookkeeping)."""
    window = steady_window(rows, skip_first)
    seconds = window_seconds(window)
    gen_s = total(values(window, "perf/actor_gen_s"))
    idle_frac = ratio(total(values(window, "perf/learner_idle_s")), seconds)
    return {
        "window_steps": [window[0]["step"], window[-1]["step"]] if window else None,
        "window_s": seconds,
        "steps_per_min": ratio(60.0 * len(window), seconds),
        # evaluations included: what a run with evaluation on the learner loses to them
        "steps_per_min_with_eval": ratio(60.0 * len(window),
                                         total(values(window, "perf/step_time"))),
        "gen_tokens_per_s": ratio(total(step_gen_tokens(r) for r in window), seconds),
        "train_tokens_per_s": ratio(total(step_train_tokens(r) for r in window), seconds),
        "learner_busy_frac": None if idle_frac is None else 1.0 - idle_frac,
        "actor_busy_frac": ratio(gen_s, seconds * actors if seconds else None),
        "sync_s_per_step": mean(values(window, "timing/sync")),
        # from telling the actors to sync to the last one holding the weights (one per sync)
        "learner_wait_s_per_sync": mean(values(window, "sync/learner_wait_s")),
        "gen_tokens_per_trained_prompt": tokens_per_trained_prompt(window),
        "aborted_tokens_per_step": mean(values(window, "gen/aborted_tokens")),
        "version_spread_max": max(values(window, "gen/version_spread_max"), default=None),
        "responses_per_step": mean(values(window, "gen/responses_per_step")),
        "stale_max": max(values(window, "stale/max"), default=None),
        "engine_fill": mean(values(window, "gen/engine_fill")),
        "dropped_frac": ratio(total(values(window, "gen/responses_dropped_stale")),
                              total(values(window, "gen/responses_per_step"))),
        # the long tail, and what consumption took from it: trained against generated length
        # p90 and share of groups past their first sampling stage, per step, averaged
        "len_generated": length_quantiles(window),
        "len_generated_p90": mean(values(window, "resp/len_generated_p90")),
        "len_trained_p90": mean(values(window, "resp/len_trained_p90")),
        "later_stage_frac": mean(values(window, "groups/later_stage_frac")),
        "later_stage_frac_trained": mean(values(window, "groups/later_stage_frac_trained")),
        # held-out evaluation on the actors (run.eval_on actors): its tokens beside training's
        "eval_tokens_share": eval_tokens_share(window),
        "G_s": mean(values(window, "perf/learner_idle_s")),
        "T_s": mean(step_busy_s(r) for r in window),
        "eval_avg@8": last_value(training_rows(rows), EVAL_AVG),
        "eval_pass@8": last_value(training_rows(rows), EVAL_PASS),
    }


def eval_tokens_share(rows: list[dict]) -> float | None:
    """The actors' held-out evaluation tokens (`eval/tokens`, run.eval_on actors) over all they
    generated in `rows`; None without such an evaluation."""
    evaluated = total(values(rows, "eval/tokens"))
    trained = total(step_gen_tokens(r) for r in rows)
    if evaluated is None or trained is None:
        return None
    return evaluated / (evaluated + trained)


def length_quantiles(rows: list[dict], bin_width: int = 8) -> dict | None:
    """p50, p90, p99 and max of every response length the rows generated (`resp/lengths`),
    and their histogram in bins of `bin_width` tokens; None when no row carries lengths."""
    lengths = sorted(n for r in rows for n in r.get("resp/lengths") or [])
    if not lengths:
        return None

    def q(p: float) -> int:  # nearest rank: a length some response had
        return lengths[min(len(lengths) - 1, max(0, math.ceil(p / 100 * len(lengths)) - 1))]

    counts = [0] * (lengths[-1] // bin_width + 1)
    for n in lengths:
        counts[n // bin_width] += 1
    return {"n": len(lengths), "p50": q(50), "p90": q(90), "p99": q(99), "max": lengths[-1],
            "bin_width": bin_width, "counts": counts}


def overlap_bound(sync: dict) -> dict:
    """What perfect overlap of generation and training could give, from the sync run: there a
    step is G then T (G = the learner's wait for groups, which is generation; T = the learner's
    own work), both with the threads they also get in async. Overlapped, a step takes max(G, T),
    so the bound on the async speedup is (G + T) / max(G, T), between 1 and 2."""
    g, t = sync.get("G_s"), sync.get("T_s")
    if not is_number(g) or not is_number(t) or max(g, t) <= 0:
        return {"G_s": g, "T_s": t, "sync_step_s": None, "bound": None,
                "predicted_steps_per_min": None}
    return {"G_s": g, "T_s": t, "sync_step_s": g + t, "bound": (g + t) / max(g, t),
            "predicted_steps_per_min": 60.0 / max(g, t)}


# ---------------------------------------------------------------------------------------------
# Weights and transport
# ---------------------------------------------------------------------------------------------


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if is_number(x))
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def timed_rounds(seconds: list[float], warmup: int = 1) -> dict:
    """Median and best of repeated timings, the first `warmup` left out (connection set-up,
    first-touch page faults) unless nothing else is left."""
    kept = seconds[warmup:] or seconds
    return {"median_s": median(kept), "best_s": min(kept) if kept else None, "rounds": len(kept)}


def gb_per_s(nbytes: float, seconds: float | None) -> float | None:
    return ratio(nbytes / 1e9, seconds)


def share_of_step(per_message_s: float | None, messages_per_step: float,
                  step_s: float | None) -> float | None:
    """Fraction of a learner step spent receiving and decoding that step's messages."""
    return ratio(per_message_s * messages_per_step if is_number(per_message_s) else None, step_s)
