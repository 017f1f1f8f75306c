"""The schedule simulator behind `rlvr plan` (rlvr/plan/sim.py, sim_actor.py, sim_engine.py):
exact cases and properties.

Most cases cost a request per row only (DecodeCost(step_s=0, row_s=...)): then batching buys
nothing and a step's generation is a known number of seconds however the requests overlap. The
batching cases give a decode step a fixed cost instead.

Run: .venv/bin/pytest tests/test_plan_sim.py -q
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.plan.sim import (DecodeCost, LearnerCosts, Machine, PromptPlan, Split, Workload,
                           fixed_prompts, simulate)

T_FIXED, T_UPDATE, BROADCAST = 0.03, 0.07, 0.004
COSTS = LearnerCosts(fixed_s=T_FIXED, update_s=T_UPDATE, broadcast_s=BROADCAST)
T = T_FIXED + T_UPDATE + BROADCAST
WORK = Workload(prompts_per_step=32, prompts_per_work=8)
ONE_STEP = fixed_prompts(length=2)  # one sample, one decode step after its prefill
PER_PROMPT = 0.008  # seconds of one such sample when cost is per row: 0.256 s for 32 prompts
G = 32 * PER_PROMPT
ROWS_ONLY = DecodeCost(step_s=0.0, row_s=PER_PROMPT)


def jittered(lo: int, hi: int):
    """One sample per prompt of 1 + uniform(lo, hi) tokens (variable response lengths)."""
    def draw(rng: random.Random) -> PromptPlan:
        return PromptPlan(((1 + rng.randint(lo, hi),),), 5.0)
    return draw


def test_sync_with_one_actor_takes_generation_then_training():
    r = simulate(Split(actors=1), WORK, COSTS, ONE_STEP, ROWS_ONLY, steps=100)
    assert r.steps_per_min == pytest.approx(60 / (G + T))
    assert r.gather_s_per_step == pytest.approx(G)
    assert r.learner_busy_frac == pytest.approx(T / (G + T))
    assert (r.stale_max, r.stale_mean, r.dropped_groups) == (0, 0.0, 0)


def test_async_with_one_busy_actor_runs_at_the_actors_pace_plus_its_broadcasts():
    r = simulate(Split(actors=1, max_staleness=2), WORK, COSTS, ONE_STEP, ROWS_ONLY, steps=200)
    assert r.steps_per_min == pytest.approx(60 / (G + BROADCAST), rel=0.01)
    assert r.actor_busy_frac > 0.95
    assert r.stale_max >= 1


def test_a_decode_step_costs_the_same_for_all_rows_it_holds():
    """Continuous batching: every request of the step decodes in the same engine steps."""
    per_step = DecodeCost(step_s=0.01)
    r = simulate(Split(1), WORK, COSTS, fixed_prompts(length=9, samples=4), per_step, steps=50)
    assert r.gather_s_per_step == pytest.approx(8 * 0.01)  # 128 rows, 8 decode steps
    two_stages = fixed_prompts(length=9, samples=4, stages=2)
    r = simulate(Split(1), WORK, COSTS, two_stages, per_step, steps=50)
    assert r.gather_s_per_step == pytest.approx(2 * 8 * 0.01)  # a stage starts when one ends


def test_requests_beyond_the_engines_batch_wait_for_room():
    narrow = DecodeCost(step_s=0.01, max_batch=32)
    r = simulate(Split(1), WORK, COSTS, fixed_prompts(length=9, samples=4), narrow, steps=50)
    assert r.gather_s_per_step == pytest.approx(4 * 8 * 0.01)  # 128 rows in waves of 32


def test_starting_requests_costs_their_prefill_once():
    cost = DecodeCost(step_s=0.0, prefill_s=0.002, prefill_row_s=0.001)
    r = simulate(Split(1), WORK, COSTS, ONE_STEP, cost, steps=50)
    # the whole step is admitted at once: one engine step starts all 32 requests
    assert r.gather_s_per_step == pytest.approx(0.002 + 32 * 0.001)


@given(costs=st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8), k=st.floats(0.01, 10.0),
       rows=st.integers(1, 512), width=st.floats(0.0, 400.0))
def test_a_scaled_engine_costs_k_times_as_much_for_every_step_and_keeps_its_shape(costs, k, rows,
                                                                                  width):
    """The planner's calibration scales a probe measured on a busier machine: every cost term of
    a decode step and of a prefill, none left at its measured value."""
    step_s, row_s, col_s, prefill_s, prefill_row_s, prefill_col_s, prefill_sq_s, tokens_sq = costs
    cost = DecodeCost(step_s, row_s, prefill_s, prefill_row_s, max_batch=64, col_s=col_s,
                      prefill_col_s=prefill_col_s, prefill_sq_s=prefill_sq_s,
                      prefill_tokens_sq_s=tokens_sq * 1e-9, prompt_tokens=17.0,
                      prompt_width=52.0, kv_slots=True)
    scaled = cost.scaled(k)
    assert scaled.decode(rows, rows * width) == pytest.approx(k * cost.decode(rows, rows * width))
    assert scaled.prefill(rows, width) == pytest.approx(k * cost.prefill(rows, width))
    assert (scaled.max_batch, scaled.prompt_tokens, scaled.prompt_width, scaled.kv_slots) == \
        (64, 17.0, 52.0, True)


def test_a_larger_bound_batches_more_requests_and_goes_faster():
    """What the item-by-item model missed: with a decode step's cost mostly fixed, admitting
    more prompts at once makes each sample cheaper, so the pace keeps rising with the bound."""
    batching = DecodeCost(step_s=0.01, row_s=1e-5)
    gen = fixed_prompts(length=9, samples=4)
    rates = [simulate(Split(1, max_staleness=s), Workload(32, 8), COSTS, gen, batching,
                      steps=200).steps_per_min for s in (0, 1, 2, 4)]
    assert rates[0] < rates[1] < rates[2] <= rates[3] * 1.001, rates
    stale = [simulate(Split(1, max_staleness=s), Workload(32, 8), COSTS, gen, batching,
                      steps=200).stale_max for s in (1, 2, 4)]
    assert stale == [1, 2, 4]


def test_a_sync_waits_for_the_requests_running():
    slow = fixed_prompts(length=41)  # 40 decode steps
    r = simulate(Split(1, max_staleness=2), WORK, COSTS, slow, DecodeCost(step_s=0.005),
                 steps=100)
    assert r.sync_s_per_step > BROADCAST + 0.01  # the learner waited in each broadcast


def test_continue_abort_and_recompute_take_weights_at_once_and_abort_pays_the_dropped_tokens():
    slow = fixed_prompts(length=41)
    cost = DecodeCost(step_s=0.005)
    runs = {p: simulate(Split(1, max_staleness=2, inflight_update=p), WORK, COSTS, slow, cost,
                        steps=100) for p in ("finish", "continue", "abort", "recompute")}
    for policy in ("continue", "abort", "recompute"):
        assert runs[policy].sync_s_per_step == pytest.approx(BROADCAST), policy
    assert runs["finish"].sync_s_per_step > BROADCAST + 0.01
    # generation-bound: what abort drops is generated again; continue and recompute keep it
    assert runs["abort"].steps_per_min < runs["continue"].steps_per_min
    assert runs["abort"].steps_per_min < runs["recompute"].steps_per_min
    assert runs["continue"].steps_per_min > runs["finish"].steps_per_min
    for r in runs.values():
        assert r.stale_max <= 2


def test_under_abort_the_limit_lets_requests_longer_than_the_time_between_syncs_finish():
    """Without a limit a request longer than the time between two syncs is dropped at every
    one, and its prompt's group holds the learner back until a quiet moment lets it through;
    with actors.abort_limit it decodes on after its restarts."""
    varied = jittered(1, 120)
    cost = DecodeCost(step_s=0.004, row_s=1e-5)

    def run(limit):
        return simulate(Split(1, max_staleness=2, inflight_update="abort", abort_limit=limit),
                        WORK, COSTS, varied, cost, steps=200)

    endless, bounded = run(None), run(2)
    assert bounded.steps_per_min > 1.2 * endless.steps_per_min


def test_under_continue_requests_that_outlive_the_bound_are_trained_unless_drop_is_asked():
    """A request keeps its oldest token's version while the learner steps on without waiting
    for it: a long one comes back staler than the bound. By default it is trained (the
    truncated behaviour weight corrects it); under drop it is thrown away and its prompt's slot
    goes to another (what the real runs showed on long answers); under finish the learner
    waits for it at the sync instead."""
    varied = jittered(1, 80)
    cost = DecodeCost(step_s=0.004, row_s=1e-5)

    def run(policy: str, stale_policy: str = "tis"):
        return simulate(Split(1, max_staleness=1, inflight_update=policy,
                              stale_policy=stale_policy), WORK, COSTS, varied, cost, steps=200)

    finish, keep, drop = run("finish"), run("continue"), run("continue", "drop")
    assert finish.dropped_groups == finish.over_bound_groups == 0 and finish.stale_max <= 1
    assert keep.dropped_groups == 0 and keep.over_bound_groups > 200 and keep.stale_max == 2
    assert drop.dropped_groups > 200 and drop.over_bound_groups == 0 and drop.stale_max <= 1
    # a dropped group is generated again: the same steps cost drop more generation
    assert keep.steps_per_min > drop.steps_per_min


def test_with_generation_free_the_learner_sets_the_pace():
    free = DecodeCost(step_s=0.0)
    for split in (Split(1), Split(3, max_staleness=2), Split(2, max_staleness=0)):
        r = simulate(split, WORK, COSTS, ONE_STEP, free, steps=100)
        assert r.steps_per_min == pytest.approx(60 / T)
        assert r.learner_busy_frac == pytest.approx(1.0)


def test_learner_ranks_share_the_update():
    free = DecodeCost(step_s=0.0)
    one = simulate(Split(1, learner_ranks=1), WORK, COSTS, ONE_STEP, free, steps=50)
    two = simulate(Split(1, learner_ranks=2), WORK, COSTS, ONE_STEP, free, steps=50)
    assert 60 / two.steps_per_min == pytest.approx(T_FIXED + T_UPDATE / 2 + BROADCAST)
    assert two.steps_per_min > one.steps_per_min


def test_enough_actors_make_the_learner_the_bottleneck():
    r = simulate(Split(actors=4, max_staleness=1), WORK, COSTS, ONE_STEP, ROWS_ONLY, steps=200)
    assert r.steps_per_min == pytest.approx(60 / T, rel=0.01)
    assert r.learner_busy_frac == pytest.approx(1.0, abs=0.01)


def test_weights_published_every_other_step_keep_the_bound_at_admission():
    # admission counts the actors' weights, a version behind before each publish: the groups of
    # that step were admitted against them, so nothing comes back over the bound (admission by
    # the learner's version let them, and drop then threw them away)
    for policy in ("tis", "drop"):
        r = simulate(Split(actors=2, max_staleness=1, stale_policy=policy),
                     Workload(32, 8, sync_every=2), COSTS, ONE_STEP, ROWS_ONLY, steps=100)
        assert r.dropped_groups == r.over_bound_groups == 0 and r.stale_max == 1, policy


def test_bad_splits_are_refused():
    with pytest.raises(ValueError, match="actors >= 1"):
        simulate(Split(actors=0), WORK, COSTS, ONE_STEP, ROWS_ONLY)
    with pytest.raises(ValueError, match="prompts_per_work"):
        simulate(Split(actors=1), Workload(32, 0), COSTS, ONE_STEP, ROWS_ONLY)
    with pytest.raises(ValueError, match="inflight_update"):
        simulate(Split(1, 2, 2, "later"), WORK, COSTS, ONE_STEP, ROWS_ONLY)


splits = st.builds(Split, actors=st.integers(1, 5), learner_ranks=st.integers(1, 3),
                   max_staleness=st.integers(0, 4),
                   inflight_update=st.sampled_from(["finish", "continue", "abort", "recompute"]),
                   stale_policy=st.sampled_from(["tis", "drop"]))
workloads = st.builds(Workload, prompts_per_step=st.sampled_from([4, 8, 12, 32]),
                      prompts_per_work=st.sampled_from([1, 3, 4, 8]),
                      sync_every=st.just(1))


def seconds(high: float, low: float = 1e-12):
    """A cost: none, or at least `low` (a cost of 1e-193 s underflows the simulator's squares,
    and no machine has one)."""
    return st.one_of(st.just(0.0), st.floats(low, high))


costs = st.builds(LearnerCosts, fixed_s=seconds(0.05), update_s=seconds(0.2),
                  broadcast_s=seconds(0.03))
decodes = st.builds(DecodeCost, step_s=seconds(0.02), row_s=seconds(0.002),
                    prefill_row_s=seconds(0.002), max_batch=st.sampled_from([4, 64, 512]),
                    col_s=seconds(1e-5), prefill_col_s=seconds(1e-5),
                    prefill_sq_s=seconds(1e-7), prefill_tokens_sq_s=seconds(1e-9, 1e-18),
                    prompt_width=st.floats(0, 60),
                    prompt_tokens=st.floats(0, 60), kv_slots=st.booleans())
lengths = st.tuples(st.integers(1, 4), st.integers(4, 30))


@settings(max_examples=40, deadline=None)
@given(split=splits, work=workloads, cost=costs, decode=decodes, gen=lengths,
       seed=st.integers(0, 3))
def test_what_outlives_the_bound_is_trained_or_dropped_and_always_counted(split, work, cost,
                                                                         decode, gen, seed):
    # admission bounds a group's staleness only if groups arrive in the order they were let
    # out: a slow one (continue: a long request on old weights; any policy: a short one
    # overtaking it) comes back staler. It is then trained and counted (tis) or dropped and
    # counted (drop), never both, never silently
    r = simulate(split, work, cost, jittered(*gen), decode, steps=60, seed=seed)
    over = r.stale_max > split.max_staleness
    if split.stale_policy == "drop":
        assert not over and r.over_bound_groups == 0
    else:
        assert r.dropped_groups == 0 and over == (r.over_bound_groups > 0)
    if split.max_staleness == 0:  # the sync schedule: nothing in flight at a sync
        assert r.stale_hist[0] == sum(r.stale_hist)


@settings(max_examples=40, deadline=None)
@given(split=splits, work=workloads, cost=costs, row_s=st.floats(1e-4, 0.02),
       seed=st.integers(0, 3))
def test_without_batching_no_split_beats_the_overlap_bound(split, work, cost, row_s, seed):
    """With a cost per row only, a step cannot be shorter than the learner's own work, nor than
    the step's generation spread perfectly over the actors. Every pass that samples a token
    costs it, the prefill too: under `recompute` a re-prefill samples a request's next token."""
    per_row = DecodeCost(0.0, row_s, prefill_row_s=row_s)
    r = simulate(split, work, cost, ONE_STEP, per_row, steps=80, seed=seed, skip_first=8)
    t = cost.fixed_s + cost.update(split.learner_ranks, 0.0)
    floor_s = max(t, work.prompts_per_step * row_s / split.actors)
    # the 72 measured steps may start with up to S + 1 steps' groups generated before them
    window = 80 - 8
    assert r.steps_per_min <= 60 / floor_s * window / (window - split.max_staleness - 1) * 1.02


@settings(max_examples=25, deadline=None)
@given(work=workloads, cost=costs, decode=decodes, gen=lengths, staleness=st.integers(0, 4),
       seed=st.integers(0, 3))
def test_more_actors_never_lower_the_predicted_pace(work, cost, decode, gen, staleness, seed):
    rates = [simulate(Split(a, 1, staleness), work, cost, jittered(*gen), decode, steps=120,
                      seed=seed).steps_per_min for a in (1, 2, 3, 4)]
    assert all(b >= a * 0.97 for a, b in zip(rates, rates[1:])), rates


def test_a_shared_machine_with_a_core_each_and_no_interference_is_the_cluster():
    shared = Machine(shared_cores=2, actor_slowdown=1.0, learner_slowdown=1.0)
    for s in (0, 2):
        a = simulate(Split(1, max_staleness=s), WORK, COSTS, ONE_STEP, ROWS_ONLY, machine=shared)
        b = simulate(Split(1, max_staleness=s), WORK, COSTS, ONE_STEP, ROWS_ONLY)
        assert a.steps_per_min == pytest.approx(b.steps_per_min)


def test_on_one_shared_core_asynchrony_buys_nothing_without_batching():
    one_core = Machine(shared_cores=1)
    sync = simulate(Split(1), WORK, COSTS, ONE_STEP, ROWS_ONLY, machine=one_core)
    for s in (1, 2, 4):
        r = simulate(Split(1, max_staleness=s), WORK, COSTS, ONE_STEP, ROWS_ONLY,
                     machine=one_core)
        assert r.steps_per_min <= sync.steps_per_min * 1.01


def test_interference_slows_only_what_overlaps():
    slow = Machine(shared_cores=2, actor_slowdown=1.5, learner_slowdown=1.5)
    sync = simulate(Split(1), WORK, COSTS, ONE_STEP, ROWS_ONLY, machine=slow)
    assert sync.steps_per_min == pytest.approx(60 / (G + T))  # they take turns
    fast = simulate(Split(1, max_staleness=2), WORK, COSTS, ONE_STEP, ROWS_ONLY)
    shared = simulate(Split(1, max_staleness=2), WORK, COSTS, ONE_STEP, ROWS_ONLY, machine=slow)
    assert sync.steps_per_min < shared.steps_per_min < fast.steps_per_min
