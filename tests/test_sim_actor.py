"""One simulated actor (rlvr/plan/sim_actor.py, sim_engine.py): the actor's own rollout code
over an engine that prices its steps. Exact cases, a decode step costing 1 s or a known column
cost, so the busy seconds and decode steps are known numbers.

Run: .venv/bin/pytest tests/test_sim_actor.py -q
"""

from __future__ import annotations

import pytest

from protocol.messages import RolloutSpec
from rlvr.plan.sim_actor import SimActor
from rlvr.plan.sim_engine import DecodeCost, PromptPlan


# -- context: a decode step costs more the more keys and values its rows attend over ----------

LONG, SHORT = PromptPlan(((201,),)), PromptPlan(((11,),))
COL, PROMPT = 1e-4, 10.0


def run_to_end(actor: SimActor) -> None:
    while actor.computing:
        actor.advance(actor.seconds_to_next_event(1.0), 1.0)


def busy_with_latecomer(cost: DecodeCost, latecomer: PromptPlan | None) -> float:
    """Busy seconds of one actor: a long answer alone, and `latecomer` joining halfway."""
    actor = SimActor(cost)
    actor.add([LONG])
    actor.advance(actor.seconds_to_next_event(1.0) / 2, 1.0)  # halfway (in time) into it
    assert 120 < actor.steps < 160  # context grows: half the time is past half the tokens
    if latecomer is not None:
        actor.add([latecomer])
    run_to_end(actor)
    return actor.busy_s


@pytest.mark.parametrize("shared", [False, True])
def test_a_row_joining_late_pays_its_own_context_or_the_engines_kv_slots(shared):
    # the HF engine's rows attend over one window as wide as the oldest row's context, so a
    # short answer started beside a long one costs the long one's width a step (vLLM: its own)
    cost = DecodeCost(step_s=0.0, col_s=COL, prompt_tokens=PROMPT, kv_slots=shared)
    extra = busy_with_latecomer(cost, SHORT) - busy_with_latecomer(cost, None)
    own = COL * sum(PROMPT + k for k in range(10))  # its 10 decode steps over its own context
    if shared:
        assert extra > 10 * own
    else:
        assert extra == pytest.approx(own, rel=0.1)


def busy_through_a_sync(cost: DecodeCost, policy: str, plan: PromptPlan = LONG) -> float:
    actor = SimActor(cost)
    actor.add([plan])
    actor.advance(actor.seconds_to_next_event(1.0) / 2, 1.0)
    actor.sync(policy)
    actor.release(1)
    run_to_end(actor)
    return actor.busy_s


def test_recompute_prefills_prompt_and_partial_again_and_decodes_on_at_the_same_context():
    free_prefill = DecodeCost(step_s=0.0, col_s=COL, prompt_tokens=PROMPT)
    # the partial answer is back in the context: the rest costs what it would have (one decode
    # step less: the re-prefill samples the first token of the rest)
    assert busy_through_a_sync(free_prefill, "recompute") == pytest.approx(
        busy_through_a_sync(free_prefill, "continue"), rel=0.01)
    per_token = 1e-3
    paid = DecodeCost(step_s=0.0, col_s=COL, prompt_tokens=PROMPT, prefill_col_s=per_token,
                      prompt_width=PROMPT)
    extra = busy_through_a_sync(paid, "recompute") - busy_through_a_sync(paid, "continue")
    # one row prefilled again over its prompt and the 120-160 tokens it had
    assert per_token * (PROMPT + 120) < extra < per_token * (PROMPT + 162)
    # a prompt of 40 tokens (its plan says so) is prefilled again 40 wide, whatever the mean
    own = PromptPlan(LONG.stages, prompt=40)
    extra = busy_through_a_sync(paid, "recompute", own) - busy_through_a_sync(paid, "continue",
                                                                               own)
    assert per_token * (40 + 120) < extra < per_token * (40 + 162)


def test_a_sample_stopped_by_recompute_takes_one_decode_step_less_its_re_prefill_samples_it():
    # the re-prefill samples the first token of the rest, as a fresh request's prefill does
    # (actors/scheduler.py re-submits prompt + partial answer as a request)
    cost = DecodeCost(step_s=1.0)
    for stop_after in (1.0, 37.0, 150.0):  # decode steps done when the sync comes
        actor = SimActor(cost)
        actor.add([LONG])
        actor.advance(stop_after, 1.0)
        actor.sync("recompute")
        actor.release(1)
        run_to_end(actor)
        # 201 tokens: the prefill's, 200 - 1 decode steps' and the re-prefill's
        assert actor.steps == pytest.approx(199), stop_after


def test_a_sample_stopped_before_its_prefill_is_done_goes_back_whole():
    cost = DecodeCost(step_s=1.0, prefill_row_s=1.0)
    actor = SimActor(cost)
    actor.add([LONG])
    actor.advance(0.5, 1.0)  # half its prefill: no token sampled
    actor.sync("recompute")
    actor.release(1)
    run_to_end(actor)
    assert actor.steps == pytest.approx(200)  # all 201 tokens still to sample: prefill + 200
    assert actor.busy_s == pytest.approx(0.5 + 1 + 200)


@pytest.mark.parametrize("short_first, slot_steps", [(True, 10 * 3 + 90 * 3),
                                                     (False, 10 * 3 + 90 * 2)])
def test_the_hf_engines_free_slot_is_computed_on_unless_it_is_the_last(short_first, slot_steps):
    # three rows in slots 0, 1, 2; the short one ends after 10 decode steps. Freed in the middle
    # (slot 0) its slot is decoded on (2 of 3 live: no compaction); freed at the end (slot 2)
    # the engine gives it up at once (tasks/kv_slots.py drop)
    short, long_ = PromptPlan(((11,),)), PromptPlan(((101,),))
    plans = [short, long_, long_] if short_first else [long_, long_, short]
    actor = SimActor(DecodeCost(step_s=0.0, row_s=1e-3, kv_slots=True))
    actor.add(plans)
    run_to_end(actor)
    assert actor.busy_s == pytest.approx(slot_steps * 1e-3)


# -- the actor's own rollout code decides stages, aborts and restarts ----------------------------

AR3PO = RolloutSpec(strategy="stop_on_correct", max_new_tokens=256, stage_sizes=[4, 4])


def decode_steps(plan: PromptPlan, spec: RolloutSpec = AR3PO, abort_on_first_correct=False):
    """Decode steps one actor takes to complete `plan`'s group (a decode step costs 1 s)."""
    actor = SimActor(DecodeCost(step_s=1.0), spec, abort_on_first_correct)
    groups = actor.add([plan])
    while actor.computing:
        groups += actor.advance(actor.seconds_to_next_event(1.0), 1.0)
    assert len(groups) == 1 and actor.inflight == 0
    return actor.steps


def test_a_prompt_whose_stage_has_a_correct_answer_stops_there_as_the_scheduler_says():
    stages = ((11, 11, 11, 11), (21, 21, 21, 21))
    wrong = ((False,) * 4, (False,) * 4)
    right = ((False, True, False, False), (False,) * 4)
    assert decode_steps(PromptPlan(stages, correct=wrong)) == pytest.approx(10 + 20)
    assert decode_steps(PromptPlan(stages, correct=right)) == pytest.approx(10)


def test_siblings_of_a_first_correct_answer_are_aborted_once_two_samples_are_in():
    # actors/scheduler.py keeps a baseline: the abort waits for min_group (2) finished samples
    plan = PromptPlan(((6, 21, 51, 51),), correct=((True, False, False, False),))
    one_stage = RolloutSpec(strategy="stop_on_correct", max_new_tokens=256, stage_sizes=[4])
    assert decode_steps(plan, one_stage) == pytest.approx(50)
    assert decode_steps(plan, one_stage, abort_on_first_correct=True) == pytest.approx(20)


def test_a_sample_dropped_by_a_sync_is_asked_for_again_behind_the_requests_already_waiting():
    # one row: A runs, B waits. An `abort` sync drops A; the scheduler asks for it again, held
    # until the weights are in, then queued where the engine queues every request: behind B
    actor = SimActor(DecodeCost(step_s=1.0, max_batch=1), abort_limit=None)
    actor.add([PromptPlan(((31,),)), PromptPlan(((11,),))])
    actor.advance(5.0, 1.0)
    actor.sync("abort")
    actor.release(1)
    ended = []
    while actor.computing:
        ended += [(round(actor.steps), v) for v, _ in actor.advance(
            actor.seconds_to_next_event(1.0), 1.0)]
    # B's 10 decode steps after the 5 A had, then A's 30 again
    assert ended == [(15, 1), (45, 1)]


def test_aborting_siblings_does_not_refund_the_prefill_of_requests_started_beside_them():
    # four rows: A's four samples run, B's wait. A's two short ones end at the first decode step,
    # B's first two take their rows (prefilled), then A's verdict aborts its two long ones and
    # B's last two take theirs: every prefill of B is paid, whatever was aborted around it
    a = PromptPlan(((2, 2, 50, 50),), correct=((True, False, False, False),))
    b = PromptPlan(((2, 2, 2, 2),), correct=((False,) * 4,))
    one_stage = RolloutSpec(strategy="stop_on_correct", max_new_tokens=256, stage_sizes=[4])
    actor = SimActor(DecodeCost(step_s=1.0, prefill_row_s=10.0, max_batch=4), one_stage,
                     abort_on_first_correct=True)
    groups = actor.add([a, b])
    while actor.computing:
        groups += actor.advance(actor.seconds_to_next_event(1.0), 1.0)
    assert len(groups) == 2
    assert actor.busy_s == pytest.approx(4 * 10 + 1 + 4 * 10 + 1)
