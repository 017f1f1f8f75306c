"""AR3PO response reuse (learner/reuse.py, docs/ALGORITHMS.md §3.3-3.5)."""

import json
import random

import pytest

from learner.advantages import grpo_advantages
from learner.reuse import ReuseBuffer, ReuseEntry, reuse_into_group


def entry(version, step=0, n=3):
    return ReuseEntry(token_ids=[version] * n, logprobs=[-0.5] * n, policy_version=version, step=step)


def test_an_unseen_prompt_has_no_past_response():
    assert ReuseBuffer().latest("q0") is None


def test_latest_returns_the_most_recently_added_response():
    buf = ReuseBuffer()
    buf.add("q", entry(1))
    buf.add("q", entry(5))
    assert buf.latest("q").policy_version == 5


def test_the_buffer_keeps_at_most_max_per_prompt_responses_per_prompt():
    buf = ReuseBuffer(max_per_prompt=2)
    for v in range(5):
        buf.add(7, entry(v))
    state = buf.state_dict()
    assert [e["policy_version"] for e in state["prompts"][0][1]] == [3, 4]


def test_state_round_trips_through_json_with_int_and_str_prompt_ids():
    buf = ReuseBuffer()
    buf.add(3, entry(1, step=10))
    buf.add("gsm8k/12", entry(2, step=11))
    restored = ReuseBuffer()
    restored.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert restored.latest(3) == entry(1, step=10)
    assert restored.latest("gsm8k/12") == entry(2, step=11)
    assert restored.latest("3") is None and len(restored) == 2


def test_loading_into_a_smaller_buffer_keeps_the_most_recent_entries():
    buf = ReuseBuffer(max_per_prompt=4)
    for v in range(4):
        buf.add("q", entry(v))
    small = ReuseBuffer(max_per_prompt=1)
    small.load_state_dict(buf.state_dict())
    assert small.state_dict()["prompts"] == [["q", [buf.state_dict()["prompts"][0][1][-1]]]]


def test_entries_are_immutable_and_need_one_logprob_per_token():
    e = entry(1)
    assert isinstance(e.token_ids, tuple)
    with pytest.raises(ValueError, match="length"):
        ReuseEntry(token_ids=[1, 2], logprobs=[-0.1], policy_version=0, step=0)


def test_only_all_fail_groups_get_a_replacement_index():
    rng = random.Random(0)
    assert reuse_into_group([False, True, False], rng) is None
    assert reuse_into_group([], rng) is None
    picks = {reuse_into_group([False] * 4, rng) for _ in range(200)}
    assert picks == {0, 1, 2, 3}


def test_reusing_one_correct_response_in_a_group_of_eight_gives_the_spec_advantages():
    accs = [False] * 8
    i = reuse_into_group(accs, random.Random(1))
    accs[i] = True
    adv = grpo_advantages(accs)
    assert adv[i].item() == pytest.approx(2.475, abs=1e-3)
    assert [a for j, a in enumerate(adv.tolist()) if j != i] == pytest.approx([-0.354] * 7, abs=1e-3)
