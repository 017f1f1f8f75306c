"""Per-token losses, aggregation, behaviour weights, KL and entropy (learner/losses.py,
docs/ALGORITHMS.md §1, §8); the algorithm-specific terms are in tests/test_losses_algorithms.py."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.losses import (
    aggregate,
    behaviour_weights,
    entropy_from_logits,
    kl_penalty,
    ppo_token_loss,
)

MODES = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
MAX_LEN = 16


def random_batch(seed, b, t, p_mask=0.7):
    """values (B, T) float64 and a 0/1 float mask (B, T) from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=g) < p_mask).to(torch.float64)
    return values, mask


def reference_aggregate(values, mask, mode, num_seqs, num_tokens, max_len):
    """Plain loops over sequences and tokens, §1.4 (an empty sequence or batch gives 0)."""
    total = 0.0
    for row, m in zip(values.tolist(), mask.tolist()):
        s, n = sum(v for v, keep in zip(row, m) if keep), sum(m)
        total += {"seq-mean-token-mean": s / max(n, 1) / num_seqs, "token-mean": s / max(num_tokens, 1),
                  "seq-mean-token-sum-norm": s / (num_seqs * max_len)}[mode]
    return total


# -- clipped surrogate (§1.3) -----------------------------------------------------------------


def ppo_at(ratio, adv, clip_low=0.2, clip_high=0.2, dual_clip=None):
    """(loss, clipped_low, clipped_high, d loss / d logp) for one token with old_logp = 0."""
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old, a = torch.zeros(1, 1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64)
    loss, low, high = ppo_token_loss(logp, old, a, clip_low, clip_high, dual_clip)
    loss.sum().backward()
    return loss.item(), low.item(), high.item(), logp.grad.item()


def test_at_ratio_one_the_loss_is_minus_the_advantage():
    loss, low, high, grad = ppo_at(1.0, 0.7)
    assert loss == pytest.approx(-0.7) and grad == pytest.approx(-0.7)
    assert not low and not high


def test_positive_advantage_above_one_plus_clip_high_is_clipped_with_zero_gradient():
    loss, low, high, grad = ppo_at(1.5, 2.0, clip_high=0.28)
    assert loss == pytest.approx(-1.28 * 2.0)
    assert high and not low and grad == 0.0


def test_negative_advantage_below_one_minus_clip_low_is_clipped_with_zero_gradient():
    loss, low, high, grad = ppo_at(0.5, -1.0)
    assert loss == pytest.approx(0.8)
    assert low and not high and grad == 0.0


def test_the_pessimistic_branch_keeps_unclipped_terms_on_the_other_side():
    assert ppo_at(0.5, 1.0)[:3] == (pytest.approx(-0.5), False, False)
    assert ppo_at(1.5, -1.0)[:3] == (pytest.approx(1.5), False, False)


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    assert ppo_at(10.0, -1.0)[0] == pytest.approx(10.0)
    loss, _, _, grad = ppo_at(10.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0
    assert ppo_at(10.0, 1.0, dual_clip=3.0)[0] == pytest.approx(-1.2)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_at(1.0, 1.0, dual_clip=0.5)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_clip_indicators_mark_exactly_the_tokens_with_zero_gradient(seed):
    g = torch.Generator().manual_seed(seed)
    logp = (0.5 * torch.randn(4, 6, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    loss, low, high = ppo_token_loss(logp, torch.zeros(4, 6, dtype=torch.float64), adv, 0.2, 0.28)
    loss.sum().backward()
    assert torch.equal(logp.grad == 0, low | high)
    assert not (low & high).any()


# -- aggregation (§1.4) -----------------------------------------------------------------------


def test_each_aggregation_mode_matches_the_hand_computed_value():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(values, mask, "token-mean", 2, 3).item() == pytest.approx(7 / 3)
    assert aggregate(values, mask, "seq-mean-token-mean", 2, 3).item() == pytest.approx(2.75)
    assert aggregate(values, mask, "seq-mean-token-sum-norm", 2, 3, max_len=4).item() == pytest.approx(7 / 8)


def test_a_sequence_with_an_all_zero_mask_contributes_zero_to_seq_mean():
    values = torch.tensor([[1.0, 2.0], [float("nan"), float("inf")]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert aggregate(values, mask, "seq-mean-token-mean", 2, 2).item() == pytest.approx(0.75)


@pytest.mark.parametrize("mode", MODES)
def test_an_all_masked_mini_batch_gives_zero_not_nan(mode):
    values = torch.randn(2, 3)
    assert aggregate(values, torch.zeros(2, 3), mode, 2, 0, max_len=MAX_LEN).item() == 0.0


def test_aggregate_rejects_unknown_modes_and_a_missing_max_len():
    with pytest.raises(ValueError, match="mode"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "sum", 1, 1)
    with pytest.raises(ValueError, match="max_len"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "seq-mean-token-sum-norm", 1, 1)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 5), t=st.integers(1, 7))
def test_aggregate_matches_a_plain_loop_reference(mode, seed, b, t):
    values, mask = random_batch(seed, b, t)
    got = aggregate(values, mask, mode, b, mask.sum(), max_len=MAX_LEN).item()
    want = reference_aggregate(values, mask, mode, b, mask.sum().item(), MAX_LEN)
    assert got == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 6), t=st.integers(1, 8),
       garbage=st.sampled_from([1e6, -1e6, float("inf"), float("nan")]))
def test_masked_tokens_do_not_change_the_aggregate(mode, seed, b, t, garbage):
    values, mask = random_batch(seed, b, t)
    dirty = values.masked_fill(mask == 0, garbage)
    args = (mode, b, mask.sum())
    assert aggregate(dirty, mask, *args, max_len=MAX_LEN).item() == aggregate(values, mask, *args, max_len=MAX_LEN).item()


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 8), t=st.integers(1, 8), data=st.data())
def test_micro_batch_sums_equal_the_full_batch_with_global_denominators(mode, seed, b, t, data):
    values, mask = random_batch(seed, b, t)
    cuts = sorted(data.draw(st.lists(st.integers(0, b), max_size=3)))
    bounds = [0, *cuts, b]
    num_seqs, num_tokens = b, mask.sum()
    full = aggregate(values, mask, mode, num_seqs, num_tokens, max_len=MAX_LEN)
    parts = sum(
        aggregate(values[lo:hi], mask[lo:hi], mode, num_seqs, num_tokens, max_len=MAX_LEN)
        for lo, hi in zip(bounds, bounds[1:])
    )
    assert float(parts) == pytest.approx(full.item(), abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_masked_log_probs_change_neither_the_ppo_loss_nor_its_gradient(seed):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(3, 5, generator=g, dtype=torch.float64)
    logp = old + 0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    mask = (torch.rand(3, 5, generator=g) < 0.6).to(torch.float64)

    def loss_and_grad(lp):
        lp = lp.clone().requires_grad_()
        loss, _, _ = ppo_token_loss(lp, old, adv, 0.2, 0.28)
        total = aggregate(loss, mask, "token-mean", 3, mask.sum())
        total.backward()
        return total.item(), lp.grad

    clean = loss_and_grad(logp)
    dirty = loss_and_grad(logp.masked_fill(mask == 0, 50.0))
    assert clean[0] == dirty[0]
    assert torch.equal(clean[1], dirty[1])
    assert (clean[1][mask == 0] == 0).all()


# -- behaviour weights (§8.3) -----------------------------------------------------------------


@pytest.mark.parametrize("mode, kept, weights", [
    ("truncate", [True, True, True], [1.0, 2.0, 0.5]),  # min(w, cap), every token stays
    ("mask", [True, False, True], [1.0, 0.0, 0.5]),  # tokens above the cap leave the loss
])
def test_weights_above_the_cap_are_truncated_or_masked(mode, kept, weights):
    prox = torch.log(torch.tensor([[1.0, 3.0, 0.5]]))
    w, keep, truncated = behaviour_weights(prox, torch.zeros(1, 3), cap=2.0, mode=mode)
    assert w[0].tolist() == pytest.approx(weights)
    assert keep[0].tolist() == kept and truncated[0].tolist() == [False, True, False]


def test_behaviour_weights_carry_no_gradient():
    prox = torch.zeros(2, 3, requires_grad=True)
    w, _, _ = behaviour_weights(prox, torch.zeros(2, 3))
    assert not w.requires_grad


# -- KL and entropy (§1.5-1.6) ----------------------------------------------------------------


def test_kl_estimators_match_their_formulas():
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    x = -0.5
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(-x)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * x * x)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(x) - x - 1)
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(logp, ref, "k4")


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_k2_and_k3_are_nonnegative_and_every_estimator_is_zero_when_the_policies_agree(seed):
    g = torch.Generator().manual_seed(seed)
    logp, ref = torch.randn(2, 2, 6, generator=g)
    assert (kl_penalty(logp, ref, "k3") >= 0).all() and (kl_penalty(logp, ref, "k2") >= 0).all()
    for kind in ("k1", "k2", "k3"):
        assert (kl_penalty(logp, logp, kind) == 0).all()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_k1_and_k3_average_to_the_kl_over_samples_of_the_policy(seed):
    # both are unbiased estimators of KL(pi_theta || pi_ref) on tokens sampled from pi_theta
    g = torch.Generator().manual_seed(seed)
    theta, ref = torch.log_softmax(torch.randn(2, 5, generator=g), dim=-1)
    exact = (theta.exp() * (theta - ref)).sum()
    for kind in ("k1", "k3"):
        expected = (theta.exp() * kl_penalty(theta, ref, kind)).sum()  # E over v ~ pi_theta
        assert expected.item() == pytest.approx(exact.item(), abs=1e-5)


def test_uniform_logits_have_entropy_log_vocab_size_in_fp32():
    h = entropy_from_logits(torch.zeros(2, 3, 50, dtype=torch.bfloat16))
    assert h.shape == (2, 3) and h.dtype == torch.float32
    assert torch.allclose(h, torch.full((2, 3), math.log(50)))


def test_entropy_matches_the_textbook_formula():
    logits = torch.randn(2, 4, 11, generator=torch.Generator().manual_seed(0))
    p = logits.softmax(-1)
    assert torch.allclose(entropy_from_logits(logits), -(p * p.log()).sum(-1), atol=1e-6)


def test_minus_infinity_logits_give_finite_entropy_and_gradient():
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    h = entropy_from_logits(logits)
    h.sum().backward()
    assert h.item() == pytest.approx(math.log(2))
    assert torch.isfinite(logits.grad).all()
