"""The delay line of injected staleness (learner/delay_line.py, docs/ALGORITHMS.md 8.2b): its
fill, gathered with one version's weights, is dealt into steps in hand-out order, not in the
order the groups finished."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.delay_line import DelayLine, GatheredStep, deal_in_handout_order
from protocol.messages import PROTOCOL_VERSION, Group, Sample


def group(n: int, length: int = 1) -> Group:
    sample = Sample(token_ids=[5] * length, logprobs=[-0.1] * length, policy_version=0,
                    reward=0.0, acc=False, truncated=False)
    return Group(protocol_version=PROTOCOL_VERSION, policy_version=0, group_id=f"g{n}",
                 prompt_id=f"p{n}", actor_id=0, work_id="w", prompt_token_ids=[1],
                 samples=[sample])


def handout_order(groups: list[Group]) -> list[Group]:
    return sorted(groups, key=lambda g: int(g.group_id[1:]))


def ids(groups: list[Group]) -> list[int]:
    return [int(g.group_id[1:]) for g in groups]


def test_the_quick_groups_do_not_all_train_first():
    # six prompts handed out in order; the short ones (even numbers) came back first, so the
    # arrival-order steps were [0 2 4] and [1 3 5]: one step of easy prompts, one of hard ones
    arrived = [GatheredStep(0, [group(n) for n in ns], [group(n) for n in ns], [], {"n": i})
               for i, ns in enumerate([(0, 2, 4), (1, 3, 5)])]
    dealt = deal_in_handout_order(arrived, handout_order)
    assert [ids(s.kept) for s in dealt] == [[0, 1, 2], [3, 4, 5]]
    assert [ids(s.generated) for s in dealt] == [[0, 1, 2], [3, 4, 5]]
    assert [s.info for s in dealt] == [{"n": 0}, {"n": 1}]


def test_steps_of_different_versions_are_not_dealt_again():
    steps = [GatheredStep(0, [group(0)], [], [], {}), GatheredStep(1, [group(1)], [], [], {})]
    with pytest.raises(ValueError, match="one version"):
        deal_in_handout_order(steps, handout_order)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 2)),
                min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_a_deal_keeps_every_group_and_every_steps_shape(shapes, rng: random.Random):
    # each step: (kept, other generated: DAPO's filtered or surplus, dropped as stale)
    numbers = list(range(sum(k + o + d for k, o, d in shapes)))
    rng.shuffle(numbers)  # the order they arrived in
    groups = iter(group(n) for n in numbers)
    steps = []
    for k, o, d in shapes:
        kept = [next(groups) for _ in range(k)]
        other = [next(groups) for _ in range(o)]
        steps.append(GatheredStep(3, kept, [*other, *kept], [next(groups) for _ in range(d)],
                                  {}))
    dealt = deal_in_handout_order(steps, handout_order)
    assert [(len(s.kept), len(s.generated), len(s.dropped), s.version) for s in dealt] == [
        (len(s.kept), len(s.generated), len(s.dropped), 3) for s in steps]
    for part in (lambda s: s.kept, lambda s: s.generated, lambda s: s.dropped):
        before = sorted(n for s in steps for n in ids(part(s)))
        after = [n for s in dealt for n in ids(part(s))]
        assert sorted(after) == before
    for part in (lambda s: s.kept, lambda s: s.dropped):  # each in hand-out order, step by step
        after = [n for s in dealt for n in ids(part(s))]
        assert after == sorted(after)
    for s in dealt:  # kept is still part of what was generated for its step
        assert set(ids(s.kept)) <= set(ids(s.generated))


def test_the_line_deals_only_its_fill():
    # K = 2: the first step gathers 3 steps at once (one version), each later step one
    arrivals = iter([[5, 3], [1, 0], [4, 2], [9, 6], [8, 7]])

    def gather() -> GatheredStep:
        gs = [group(n) for n in next(arrivals)]
        return GatheredStep(0, gs, list(gs), [], {})

    trained: list[list[str]] = []
    line = DelayLine(2, gather, trained.append, handout_order)
    first = line.next(version=0)
    assert ids(first.kept) == [0, 1]
    assert [ids(s.kept) for s in line.line] == [[2, 3], [4, 5]]
    assert trained == [["g0", "g1"]]
    assert ids(line.next(version=1).kept) == [2, 3]
    assert [ids(s.kept) for s in line.line] == [[4, 5], [9, 6]]  # gathered alone: as it came
