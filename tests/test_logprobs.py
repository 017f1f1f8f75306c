"""Chunked log-probs (learner/logprobs.py) equal the full-logits ones, values and gradients, at
any temperature; rows are cut into mini-batches of whole groups and micro-batches within a
token budget (learner/batch.py)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.batch import Row, micro_batches, mini_batches, of_responses, on_responses, pack
from learner.logprobs import chunk_tokens, full_logits_logp, token_logp
from learner.losses import entropy_from_logits
from tasks.tiny_model import build_model, build_tokenizer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(build_tokenizer(), hidden=32, layers=2, heads=2, ffn=64)


def rows_of(seed: int, n: int = 4) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt = [rng.randrange(5, 90) for _ in range(rng.randrange(1, 6))]
        resp = [rng.randrange(5, 90) for _ in range(rng.randrange(1, 9))]
        rows.append(Row(prompt, resp, [0.0] * len(resp), 1.0, 0))
    return rows


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 3, None])
def test_chunked_logprobs_and_entropy_equal_the_full_logits_ones_with_their_gradients(
        model, temperature, chunk):
    packed = pack(rows_of(1), 0)
    m = packed.mask
    weights = torch.randn(m.shape, generator=torch.Generator().manual_seed(0))
    model.zero_grad()
    logp, ent = token_logp(model, packed, temperature, entropy=True, entropy_grad=True,
                           chunk=chunk)
    ((logp * weights).sum() + (ent * weights).sum()).backward()
    chunked = grads(model)
    full, logits = full_logits_logp(model, packed, temperature)
    ((full * m * weights).sum() + (entropy_from_logits(logits) * m * weights).sum()).backward()
    torch.testing.assert_close(logp, full * m, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, entropy_from_logits(logits).detach() * m, rtol=0, atol=1e-5)
    for got, want in zip(chunked, grads(model)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_log_probs_are_those_of_the_tempered_softmax(model):
    packed = pack(rows_of(2), 0)
    with torch.no_grad():
        hot, _ = token_logp(model, packed, 0.5)
        logits = model(input_ids=packed.input_ids).logits[:, :-1]
    want = torch.log_softmax(logits / 0.5, -1).gather(-1, packed.targets[..., None])[..., 0]
    torch.testing.assert_close(hot, want * packed.mask, rtol=0, atol=1e-5)
    assert not torch.allclose(hot, token_logp(model, packed, 1.0)[0].detach())


def test_no_grad_passes_give_the_training_forward_s_values(model):
    packed = pack(rows_of(3), 0)
    with_grad, _ = token_logp(model, packed, 0.7)
    with torch.no_grad():
        without, _ = token_logp(model, packed, 0.7)
    torch.testing.assert_close(with_grad.detach(), without, rtol=0, atol=1e-6)


def test_the_entropy_carries_gradient_only_when_asked_and_is_the_same_either_way(model):
    packed = pack(rows_of(4), 0)
    _, metric = token_logp(model, packed, 0.7, entropy=True, chunk=2)
    assert not metric.requires_grad
    _, bonus = token_logp(model, packed, 0.7, entropy=True, entropy_grad=True)
    assert bonus.requires_grad
    torch.testing.assert_close(metric, bonus.detach(), rtol=0, atol=1e-5)


def test_a_chunk_s_logits_take_a_fixed_budget_whatever_the_vocabulary():
    assert chunk_tokens(151_936) == 220 and chunk_tokens(101) > 100_000


def test_response_values_round_trip_through_target_aligned_tensors():
    rows = rows_of(5)
    values = [torch.arange(len(r.response), dtype=torch.float32) + 1 for r in rows]
    placed = on_responses(rows, values, pack(rows, 0).mask.shape[1])
    assert ((placed != 0).float() == pack(rows, 0).mask).all()
    for got, want in zip(of_responses(rows, placed), values):
        assert torch.equal(got, want)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
       max_seqs=st.integers(1, 8), max_tokens=st.one_of(st.none(), st.integers(1, 120)))
def test_micro_batches_hold_every_row_once_within_both_limits(lengths, max_seqs, max_tokens):
    batches = micro_batches(list(range(len(lengths))), lambda i: lengths[i], max_seqs, max_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= max_seqs
        padded = len(b) * max(lengths[i] for i in b)
        # over the budget only as a row of its own that is longer than the budget
        assert max_tokens is None or padded <= max_tokens or (len(b) == 1)


def test_rows_are_packed_by_length_into_the_token_budget():
    lengths = [10, 3, 3, 5, 12, 4]
    batches = micro_batches(list(range(6)), lambda i: lengths[i], max_seqs=8, max_tokens=12)
    assert [[lengths[i] for i in b] for b in batches] == [[3, 3, 4], [5], [10], [12]]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12), count=st.integers(1, 6))
def test_mini_batches_take_whole_groups_in_order_and_as_evenly_as_can_be(sizes, count):
    ids = [f"g{g}" for g, n in enumerate(sizes) for _ in range(n)]
    sets = mini_batches(ids, count)
    assert len(sets) == count and [i for s in sets for i in s] == list(range(len(ids)))
    groups_per_set = [len({ids[i] for i in s}) for s in sets]
    assert max(groups_per_set) - min(groups_per_set) <= 1
    assert all(len({ids[i] for i in s}.intersection(ids[j] for j in t)) == 0
               for a, s in enumerate(sets) for t in sets[a + 1:])
