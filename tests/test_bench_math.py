"""The arithmetic of `rlvr bench` (rlvr/bench/run_metrics.py and the summaries built on it) on
synthetic metric rows, where every expected number can be worked out by hand."""

import math

import pytest

from rlvr.bench import efficiency, throughput
from rlvr.bench.run_metrics import (accuracy_by_responses, default_target_acc, first_reach,
                                  gb_per_s, length_quantiles, mean_std, overlap_bound,
                                  reductions, run_efficiency, run_throughput, share_of_step,
                                  steady_window, timed_rounds, training_rows)
from rlvr.bench.targets import target


def eval_row(step, avg, time_s, pass_at_8=None):
    return {"step": step, "time_s": time_s, "eval/avg@8": avg,
            "eval/pass@8": avg if pass_at_8 is None else pass_at_8}


def gen_row(step, responses, time_s, prompts=4, **extra):
    return {"step": step, "time_s": time_s, "gen/responses_per_step": responses,
            "gen/responses_per_prompt": responses / prompts,
            "gen/responses_per_trained_prompt": responses / prompts,
            "gen/tokens": 5 * responses, **extra}


def efficiency_run(per_step, evals, dt=1.0):
    """Rows of a run: step 0 evaluates; step s generates per_step[s-1] responses; `evals` maps
    step -> eval/avg@8 (merged into that step's row)."""
    rows = [eval_row(0, evals.get(0, 0.4), 10.0)]
    for s, n in enumerate(per_step, start=1):
        row = gen_row(s, n, 10.0 + dt * s)
        if s in evals:
            row.update({"eval/avg@8": evals[s], "eval/pass@8": evals[s] + 0.1})
        rows.append(row)
    return rows


# -- means and spreads ---------------------------------------------------------------------------

def test_mean_std_is_the_sample_spread_and_zero_for_one_seed():
    assert mean_std([1.0, 3.0]) == {"mean": 2.0, "std": math.sqrt(2.0), "n": 2}
    assert mean_std([0.5]) == {"mean": 0.5, "std": 0.0, "n": 1}


def test_missing_and_non_finite_values_are_left_out_not_counted_as_zero():
    assert mean_std([None, float("nan"), 2.0, 4.0])["mean"] == 3.0
    assert mean_std([None]) == {"mean": None, "std": None, "n": 0}


def test_training_rows_leave_out_the_evaluation_before_training_and_sort_by_step():
    rows = [gen_row(2, 8, 2.0), eval_row(0, 0.4, 0.0), gen_row(1, 8, 1.0)]
    assert [r["step"] for r in training_rows(rows)] == [1, 2]


# -- efficiency ----------------------------------------------------------------------------------

def test_responses_per_step_is_the_mean_over_training_steps_with_the_last_tenth_apart():
    rows = efficiency_run([32] * 9 + [12], {10: 0.6})
    e = run_efficiency(rows, None)
    assert e["responses_per_step"] == pytest.approx(30.0)
    assert e["responses_per_step_last10pct"] == 12.0
    assert e["total_responses"] == 300
    assert e["total_gen_tokens"] == 1500


def test_generated_tokens_fall_back_to_mean_length_times_responses():
    row = gen_row(1, 10, 1.0)
    del row["gen/tokens"]
    row["resp/len_mean"] = 4.5
    assert run_efficiency([eval_row(0, 0.4, 0.0), row], None)["total_gen_tokens"] == 45.0


def test_first_reach_counts_every_response_generated_up_to_that_evaluation():
    rows = efficiency_run([10, 20, 30, 40], {2: 0.5, 4: 0.7})
    assert first_reach(rows, "eval/avg@8", 0.5) == {"step": 2, "responses": 30.0}
    assert first_reach(rows, "eval/avg@8", 0.6) == {"step": 4, "responses": 100.0}
    assert first_reach(rows, "eval/avg@8", 0.9) is None


def test_an_initial_model_already_at_the_target_reaches_it_with_zero_responses():
    rows = efficiency_run([10], {0: 0.8, 1: 0.8})
    assert first_reach(rows, "eval/avg@8", 0.5) == {"step": 0, "responses": 0.0}
    assert accuracy_by_responses(rows) == [(0, 0.0, 0.8), (1, 10.0, 0.8)]


def test_final_accuracy_is_the_last_evaluation_after_training_and_wall_time_excludes_startup():
    rows = efficiency_run([8, 8, 8], {0: 0.3, 3: 0.55}, dt=2.0)
    e = run_efficiency(rows, 0.5)
    assert e["eval_avg@8_initial"] == 0.3
    assert e["eval_avg@8"] == 0.55 and e["eval_pass@8"] == pytest.approx(0.65)
    assert e["wall_s"] == 6.0  # step 0's row (after start-up and the first eval) to step 3's
    assert e["responses_to_target"] == 24.0 and e["steps_to_target"] == 3


def test_reduction_factor_is_baseline_responses_over_the_algorithms():
    algos = {"dapo": {"responses_per_step": {"mean": 400.0}},
             "grpo": {"responses_per_step": {"mean": 256.0}},
             "ar3po": {"responses_per_step": {"mean": 100.0}}}
    f = reductions(algos)
    assert f["ar3po"] == {"vs_dapo": 4.0, "vs_grpo": 2.56}
    assert f["grpo"]["vs_grpo"] == 1.0


def test_default_target_is_the_lowest_final_accuracy_among_algorithms():
    assert default_target_acc({"a": 0.6, "b": 0.55, "c": None}) == 0.55
    assert default_target_acc({}) is None


def test_efficiency_summary_over_seeds_with_ar3po_against_dapo_and_grpo():
    ar3po = [efficiency_run([20] * 4, {4: 0.62}), efficiency_run([30] * 4, {4: 0.60})]
    dapo = [efficiency_run([100] * 4, {4: 0.62})]
    grpo = [efficiency_run([32] * 4, {2: 0.58, 4: 0.58})]
    s = efficiency.summarize({"grpo": grpo, "dapo": dapo, "ar3po": ar3po}, None)
    assert s["target_acc"] == 0.58
    assert s["algorithms"]["ar3po"]["responses_per_step"]["mean"] == 25.0
    assert s["algorithms"]["ar3po"]["eval_avg@8"]["mean"] == pytest.approx(0.61)
    assert s["algorithms"]["grpo"]["responses_to_target"]["mean"] == 64.0  # reached at step 2
    assert s["ar3po_reduction_vs_dapo"] == 4.0
    assert s["ar3po_reduction_vs_grpo"] == pytest.approx(32 / 25)
    t = s["targets"]
    assert t["ar3po_4x_fewer_responses_than_dapo"]["met"] is True
    assert t["ar3po_accuracy_within_2pt_of_dapo"]["met"] is True  # 0.61 >= 0.62 - 0.02
    assert t["ar3po_accuracy_at_least_grpo"]["met"] is True
    assert "ar3po" in efficiency.report(s)


def test_targets_say_not_met_with_the_numbers_and_unknown_when_one_is_missing():
    assert target("x >= 4", 3.9, ">=", 4.0) == {"met": False, "value": 3.9, "op": ">=",
                                                "threshold": 4.0, "rule": "x >= 4"}
    assert target("x < 0.02", 0.01, "<", 0.02)["met"] is True
    assert target("x >= 4", None, ">=", 4.0)["met"] is None


# -- throughput ----------------------------------------------------------------------------------

def step_row(step, step_time, idle, **extra):
    return {"step": step, "time_s": float(step), "perf/step_time": step_time,
            "perf/learner_idle_s": idle, "gen/responses_per_step": 10, "gen/tokens": 60,
            "perf/train_tokens_per_s": 100.0, "timing/update": 0.3, "timing/sync": 0.05,
            "perf/actor_gen_s": idle, **extra}


def throughput_run(step_time, idle, steps=5, last_eval=0.6):
    rows = [eval_row(0, 0.4, 0.0)]
    rows += [step_row(s, step_time, idle) for s in range(1, steps + 1)]
    rows[1]["perf/step_time"] += 5.0  # pipeline fill: left out of the steady window
    rows[-1].update({"perf/step_time": step_time + 2.0, "timing/eval": 2.0,
                     "eval/avg@8": last_eval, "eval/pass@8": last_eval})
    return rows


def test_steady_window_leaves_out_the_first_and_the_last_step():
    rows = throughput_run(1.0, 0.5, steps=5)
    assert [r["step"] for r in steady_window(rows)] == [2, 3, 4]
    assert [r["step"] for r in steady_window(rows[:3])] == [1, 2]  # too short: every step


def test_throughput_of_one_run_over_its_steady_window():
    t = run_throughput(throughput_run(1.5, 0.5), actors=2)
    assert t["window_steps"] == [2, 4] and t["window_s"] == 4.5
    assert t["steps_per_min"] == pytest.approx(40.0)
    assert t["gen_tokens_per_s"] == pytest.approx(180 / 4.5)
    assert t["train_tokens_per_s"] == pytest.approx(90 / 4.5)
    assert t["learner_busy_frac"] == pytest.approx(1 - 1.5 / 4.5)
    assert t["actor_busy_frac"] == pytest.approx(1.5 / (4.5 * 2))
    assert t["G_s"] == 0.5 and t["T_s"] == pytest.approx(1.0)
    assert t["sync_s_per_step"] == pytest.approx(0.05) and t["eval_avg@8"] == 0.6


def test_length_quantiles_pool_every_steps_responses_and_are_lengths_some_response_had():
    # 200 responses over two steps, 1..100 tokens twice: nearest-rank quantiles of the pool
    rows = [{"resp/lengths": list(range(100, 0, -1))}, {"resp/lengths": list(range(1, 101))},
            {"step": 3}]  # a row without lengths (an old run) adds nothing
    q = length_quantiles(rows, bin_width=10)
    assert (q["n"], q["p50"], q["p90"], q["p99"], q["max"]) == (200, 50, 90, 99, 100)
    assert sum(q["counts"]) == 200 and q["counts"][0] == 2 * 9 and q["counts"][10] == 2
    assert length_quantiles([{"step": 1}]) is None


def test_evaluation_inside_a_step_is_not_counted_as_learner_work_or_training_time():
    rows = throughput_run(1.0, 0.25, steps=2)  # window falls back to both steps, eval included
    t = run_throughput(rows, actors=1)
    assert t["window_s"] == pytest.approx(6.0 + 1.0)  # (1 + 5) + (1 + 2 - 2)
    assert t["T_s"] == pytest.approx((5.75 + 0.75) / 2)


def test_overlap_bound_is_sync_step_over_the_larger_of_generation_and_training():
    b = overlap_bound({"G_s": 0.6, "T_s": 0.4})
    assert b["bound"] == pytest.approx(1.0 / 0.6) and b["sync_step_s"] == 1.0
    assert b["predicted_steps_per_min"] == pytest.approx(100.0)
    assert overlap_bound({"G_s": 1.0, "T_s": 1.0})["bound"] == 2.0  # perfectly balanced
    assert overlap_bound({"G_s": None, "T_s": 0.4})["bound"] is None


def test_throughput_summary_speedup_fraction_of_bound_and_targets():
    rows = {"sync": throughput_run(1.0, 0.5, last_eval=0.60),  # G = T = 0.5: bound 2
            "async_s2": throughput_run(0.55, 0.05, last_eval=0.58)}
    s = throughput.summarize(rows, actors=1)
    assert s["overlap_bound"] == pytest.approx(2.0)
    assert s["speedup_async_vs_sync"] == pytest.approx(1.0 / 0.55)
    assert s["async_fraction_of_bound"] == pytest.approx(1.0 / 0.55 / 2.0)
    assert s["modes"]["async_s2"]["learner_busy_frac"] == pytest.approx(1 - 0.05 / 0.55)
    t = s["targets"]
    assert t["async_fraction_of_overlap_bound"]["met"] is True   # 0.909 >= 0.9
    assert t["async_speedup_vs_sync"]["met"] is True
    assert t["async_accuracy_within_3pt_of_sync"]["met"] is True  # 0.58 >= 0.60 - 0.03
    assert t["async_learner_busy"]["met"] is True                 # 0.909 >= 0.85
    assert "async_s2" in throughput.report(s)


def test_in_flight_policy_modes_are_judged_on_finish_the_default_async_policy():
    rows = {"sync": throughput_run(1.0, 0.5), "async_s2_finish": throughput_run(0.55, 0.05),
            "async_s2_continue": throughput_run(2.0, 0.05)}
    s = throughput.summarize(rows, actors=1)
    assert s["async_mode"] == "async_s2_finish"
    assert s["speedup_async_vs_sync"] == pytest.approx(1.0 / 0.55)
    assert s["targets"]["async_speedup_vs_sync"]["met"] is True


def test_throughput_summary_without_a_sync_run_has_no_bound():
    s = throughput.summarize({"async_s2": throughput_run(0.55, 0.05)}, actors=1)
    assert s["overlap_bound"] is None and s["speedup_async_vs_sync"] is None
    assert s["targets"]["async_speedup_vs_sync"]["met"] is None


def test_learner_wait_per_sync_of_each_inflight_policy_and_the_5x_targets():
    def run(wait_s):
        rows = throughput_run(1.0, 0.5)
        for r in rows[1:]:
            r.update({"sync/learner_wait_s": wait_s, "groups/trained_ids": ["a", "b"],
                      "gen/aborted_tokens": 4, "gen/version_spread_max": 1,
                      "gen/engine_fill": 0.25, "gen/responses_dropped_stale": 2,
                      "gen/responses_per_step": 16})
        return rows
    s = throughput.summarize({"async_s2_finish": run(0.10), "async_s2_continue": run(0.01),
                              "async_s2_abort": run(0.04)}, actors=1)
    m = s["modes"]["async_s2_continue"]
    assert m["learner_wait_s_per_sync"] == pytest.approx(0.01)
    assert m["gen_tokens_per_trained_prompt"] == pytest.approx(60 / 2)
    assert m["aborted_tokens_per_step"] == 4 and m["version_spread_max"] == 1
    assert m["engine_fill"] == 0.25 and m["dropped_frac"] == pytest.approx(2 / 16)
    t = s["targets"]
    assert t["learner_wait_continue_5x_below_finish"]["value"] == pytest.approx(10.0)
    assert t["learner_wait_continue_5x_below_finish"]["met"] is True
    assert t["learner_wait_abort_5x_below_finish"]["met"] is False  # 2.5x
    assert "learner wait ms/sync" in throughput.report(s)


def test_abort_on_first_correct_targets_compare_tokens_per_trained_prompt_and_accuracy():
    def seeds(tokens, acc):
        return [[eval_row(0, 0.4, 0.0),
                 {"step": 1, "time_s": 1.0, "gen/responses_per_step": 10, "gen/tokens": tokens,
                  "groups/trained_ids": ["a", "b", "c", "d"], "eval/avg@8": acc}]] * 3
    s = efficiency.summarize({"ar3po_abort": seeds(90, 0.60), "ar3po": seeds(100, 0.61)},
                             target_acc=0.5)
    assert s["algorithms"]["ar3po_abort"]["gen_tokens_per_trained_prompt"]["mean"] == 22.5
    t = s["targets"]
    assert t["ar3po_abort_fewer_tokens_per_trained_prompt"]["met"] is True  # 22.5 < 25
    assert t["ar3po_abort_accuracy_within_2pt"]["met"] is True  # 0.60 >= 0.61 - 0.02


# -- weights and transport -----------------------------------------------------------------------

def test_timed_rounds_leave_out_the_warm_up_round():
    assert timed_rounds([9.0, 1.0, 3.0, 2.0]) == {"median_s": 2.0, "best_s": 1.0, "rounds": 3}
    assert timed_rounds([4.0]) == {"median_s": 4.0, "best_s": 4.0, "rounds": 1}


def test_bandwidth_and_share_of_a_step():
    assert gb_per_s(2e9, 0.5) == 4.0
    assert gb_per_s(1e9, 0.0) is None
    assert share_of_step(20e-6, 32, 0.1) == pytest.approx(0.0064)
    assert share_of_step(None, 32, 0.1) is None
