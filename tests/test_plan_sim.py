"""The schedule simulator behind `rlvr plan` (rlvr/plan/sim.py): exact cases and properties.

Run: .venv/bin/pytest tests/test_plan_sim.py -q
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.plan.sim import Item, LearnerCosts, Machine, Split, Workload, fixed_items, simulate

T_FIXED, T_UPDATE, BROADCAST = 0.03, 0.07, 0.004
COSTS = LearnerCosts(fixed_s=T_FIXED, update_s=T_UPDATE, broadcast_s=BROADCAST)
T = T_FIXED + T_UPDATE + BROADCAST
WORK = Workload(prompts_per_step=32, prompts_per_work=8)


def jittered(mean_s: float, spread: float):
    """Work items of uniformly varying length (what variable response lengths do)."""
    def draw(rng: random.Random, prompts: int) -> Item:
        return Item(rng.uniform(mean_s * (1 - spread), mean_s * (1 + spread)), (5.0,) * prompts)
    return draw


def test_sync_with_one_actor_takes_generation_then_training():
    r = simulate(Split(actors=1), WORK, COSTS, fixed_items(0.064), steps=100)
    g = 4 * 0.064  # 32 prompts in items of 8, one after another
    assert r.steps_per_min == pytest.approx(60 / (g + T))
    assert r.gather_s_per_step == pytest.approx(g)
    assert r.learner_busy_frac == pytest.approx(T / (g + T))
    assert (r.stale_max, r.stale_mean, r.dropped_groups) == (0, 0.0, 0)


def test_async_with_one_busy_actor_runs_at_the_actors_pace_plus_its_broadcasts():
    # generation-bound: the actor never idles; per step it does 4 items and joins a broadcast
    r = simulate(Split(actors=1, max_staleness=2), WORK, COSTS, fixed_items(0.064), steps=200)
    assert r.steps_per_min == pytest.approx(60 / (4 * 0.064 + BROADCAST))
    assert r.actor_busy_frac > 0.95
    # the learner waits in each broadcast for the item in progress: what async pays for syncs
    assert r.sync_s_per_step > BROADCAST
    assert r.stale_max == 1  # a lone actor never gets further ahead than one version


def test_with_generation_free_the_learner_sets_the_pace():
    for split in (Split(1), Split(3, max_staleness=2), Split(2, max_staleness=0)):
        r = simulate(split, WORK, COSTS, fixed_items(0.0), steps=100)
        assert r.steps_per_min == pytest.approx(60 / T)
        assert r.learner_busy_frac == pytest.approx(1.0)


def test_learner_ranks_share_the_update():
    fast_gen = fixed_items(0.0)
    one = simulate(Split(1, learner_ranks=1), WORK, COSTS, fast_gen, steps=50)
    two = simulate(Split(1, learner_ranks=2), WORK, COSTS, fast_gen, steps=50)
    assert 60 / two.steps_per_min == pytest.approx(T_FIXED + T_UPDATE / 2 + BROADCAST)
    assert two.steps_per_min > one.steps_per_min


def test_enough_actors_make_the_learner_the_bottleneck():
    r = simulate(Split(actors=4, max_staleness=1), WORK, COSTS, fixed_items(0.064), steps=200)
    assert r.steps_per_min == pytest.approx(60 / T, rel=0.01)
    assert r.learner_busy_frac == pytest.approx(1.0, abs=0.01)


def test_weights_published_every_other_step_let_groups_go_stale_and_drop():
    r = simulate(Split(actors=2, max_staleness=1), Workload(32, 8, sync_every=2), COSTS,
                 fixed_items(0.064), steps=100)
    assert r.dropped_groups > 0  # consumption rule: staler than the bound -> dropped
    assert r.stale_max <= 1  # what is trained stays within the bound


def test_bad_splits_are_refused():
    with pytest.raises(ValueError, match="actors >= 1"):
        simulate(Split(actors=0), WORK, COSTS, fixed_items(0.1))
    with pytest.raises(ValueError, match="prompts_per_work"):
        simulate(Split(actors=1), Workload(32, 0), COSTS, fixed_items(0.1))


splits = st.builds(Split, actors=st.integers(1, 5), learner_ranks=st.integers(1, 3),
                   max_staleness=st.integers(0, 4))
workloads = st.builds(Workload, prompts_per_step=st.sampled_from([4, 8, 12, 32]),
                      prompts_per_work=st.sampled_from([1, 3, 4, 8]),
                      sync_every=st.just(1))
costs = st.builds(LearnerCosts, fixed_s=st.floats(0, 0.05), update_s=st.floats(0, 0.2),
                  broadcast_s=st.floats(0, 0.03))
gens = st.tuples(st.floats(0.001, 0.2), st.floats(0, 0.9))


@settings(max_examples=40, deadline=None)
@given(split=splits, work=workloads, cost=costs, gen=gens, seed=st.integers(0, 3))
def test_the_staleness_reached_never_exceeds_the_bound(split, work, cost, gen, seed):
    r = simulate(split, work, cost, jittered(*gen), steps=60, seed=seed)
    assert r.stale_max <= split.max_staleness
    assert r.dropped_groups == 0  # weights every step: admission alone keeps within the bound
    if split.max_staleness == 0:
        assert r.stale_hist[0] == sum(r.stale_hist)


@settings(max_examples=40, deadline=None)
@given(split=splits, work=workloads, cost=costs, gen=gens, seed=st.integers(0, 3))
def test_no_split_beats_the_overlap_bound(split, work, cost, gen, seed):
    """A step cannot be shorter than the learner's own work, nor than the step's generation
    spread perfectly over the actors."""
    mean_s, _ = gen
    r = simulate(split, work, cost, fixed_items(mean_s), steps=80, seed=seed)
    t = cost.fixed_s + cost.update(split.learner_ranks, 0.0)
    items_per_step = work.prompts_per_step / work.prompts_per_work  # at least, on average
    floor_s = max(t, items_per_step * mean_s / split.actors)
    assert r.steps_per_min <= 60 / floor_s * 1.02


@settings(max_examples=25, deadline=None)
@given(work=workloads, cost=costs, gen=gens, staleness=st.integers(0, 4), seed=st.integers(0, 3))
def test_more_actors_never_lower_the_predicted_pace(work, cost, gen, staleness, seed):
    rates = [simulate(Split(a, 1, staleness), work, cost, jittered(*gen), steps=120,
                      seed=seed).steps_per_min for a in (1, 2, 3, 4)]
    assert all(b >= a * 0.97 for a, b in zip(rates, rates[1:])), rates


def test_a_shared_machine_with_a_core_each_and_no_interference_is_the_cluster():
    shared = Machine(shared_cores=2, actor_slowdown=1.0, learner_slowdown=1.0)
    for s in (0, 2):
        a = simulate(Split(1, max_staleness=s), WORK, COSTS, fixed_items(0.064), machine=shared)
        b = simulate(Split(1, max_staleness=s), WORK, COSTS, fixed_items(0.064))
        assert a.steps_per_min == pytest.approx(b.steps_per_min)


def test_on_one_shared_core_asynchrony_buys_nothing():
    one_core = Machine(shared_cores=1)
    sync = simulate(Split(1), WORK, COSTS, fixed_items(0.064), machine=one_core)
    for s in (1, 2, 4):
        r = simulate(Split(1, max_staleness=s), WORK, COSTS, fixed_items(0.064),
                     machine=one_core)
        assert r.steps_per_min <= sync.steps_per_min * 1.01


def test_interference_slows_only_what_overlaps():
    slow = Machine(shared_cores=2, actor_slowdown=1.5, learner_slowdown=1.5)
    sync = simulate(Split(1), WORK, COSTS, fixed_items(0.064), machine=slow)
    assert sync.steps_per_min == pytest.approx(60 / (4 * 0.064 + T))  # they take turns
    fast = simulate(Split(1, max_staleness=2), WORK, COSTS, fixed_items(0.064))
    shared = simulate(Split(1, max_staleness=2), WORK, COSTS, fixed_items(0.064), machine=slow)
    assert sync.steps_per_min < shared.steps_per_min < fast.steps_per_min
