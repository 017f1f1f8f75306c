"""Per-token losses, aggregation, weights and masks (learner/losses.py, ALGORITHMS.md §1-2, §5-6, §8)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.losses import (
    aggregate,
    behaviour_weights,
    dapo_keep_group,
    dapo_overlong_penalty,
    entropy_from_logits,
    gcpo_loss,
    kl_penalty,
    ppo_token_loss,
    veto_mask,
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
def test_k3_is_nonnegative_and_zero_when_the_policies_agree(seed):
    g = torch.Generator().manual_seed(seed)
    logp, ref = torch.randn(2, 2, 6, generator=g)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert (kl_penalty(logp, logp, "k3") == 0).all()


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


# -- mu-GRPO veto (§5.2-5.3) ------------------------------------------------------------------

TINY = 1e-5
RATIO = torch.tensor([[1.0, 1.0, TINY, 1.0, TINY, 1.0]])  # triggers at 2 and 4


def test_suffix_scope_drops_tokens_strictly_after_the_first_trigger():
    new, trig, dropped = veto_mask(RATIO, torch.tensor([-1.0]), torch.ones(1, 6))
    assert new.tolist() == [[1, 1, 1, 0, 0, 0]]
    assert trig.tolist() == [[False, False, True, False, True, False]]
    assert dropped.tolist() == [[False, False, False, True, True, True]]


def test_nontrigger_suffix_scope_keeps_later_triggers():
    new, _, _ = veto_mask(RATIO, torch.tensor([-1.0]), torch.ones(1, 6), scope="nontrigger_suffix")
    assert new.tolist() == [[1, 1, 1, 0, 1, 0]]


def test_sequence_scope_drops_the_whole_response():
    new, _, dropped = veto_mask(RATIO, torch.tensor([-1.0]), torch.ones(1, 6), scope="sequence")
    assert new.tolist() == [[0] * 6] and dropped.all()


def test_positive_and_zero_advantage_responses_are_never_vetoed():
    ratio = RATIO.expand(2, 6)
    new, trig, dropped = veto_mask(ratio, torch.tensor([1.0, 0.0]), torch.ones(2, 6), scope="sequence")
    assert new.tolist() == [[1] * 6] * 2 and not trig.any() and not dropped.any()


def test_a_ratio_equal_to_delta_is_not_a_trigger():
    ratio = torch.tensor([[1.0, 1e-4, 1.0]])
    new, trig, _ = veto_mask(ratio, torch.tensor([-1.0]), torch.ones(1, 3), delta=1e-4)
    assert not trig.any() and new.tolist() == [[1, 1, 1]]


def test_masked_tokens_neither_trigger_nor_count_as_dropped():
    mask = torch.tensor([[True, True, False, True, True, False]])
    new, trig, dropped = veto_mask(RATIO, torch.tensor([-1.0]), mask)
    assert trig.tolist() == [[False, False, False, False, True, False]]
    assert dropped.tolist() == [[False] * 6]  # nothing in the loss lies after position 4
    assert new.dtype == torch.bool and torch.equal(new, mask)


def reference_veto(ratio, adv, mask, delta, scope):
    """Plain loops over responses and tokens, §5.2."""
    new = mask.clone()
    for i in range(ratio.shape[0]):
        trig = [bool(mask[i, t]) and adv[i] < 0 and ratio[i, t] < delta for t in range(ratio.shape[1])]
        if not any(trig):
            continue
        kappa = trig.index(True)
        for t in range(ratio.shape[1]):
            after = t > kappa
            drop = {"suffix": after, "nontrigger_suffix": after and not trig[t], "sequence": True}[scope]
            if drop:
                new[i, t] = 0
    return new


@pytest.mark.parametrize("scope", ["suffix", "nontrigger_suffix", "sequence"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_veto_mask_matches_a_plain_loop_reference(scope, seed):
    g = torch.Generator().manual_seed(seed)
    ratio = torch.where(torch.rand(4, 7, generator=g) < 0.2, torch.tensor(1e-6), torch.tensor(1.0))
    adv = torch.randn(4, generator=g)
    mask = (torch.rand(4, 7, generator=g) < 0.8).float()
    new, _, dropped = veto_mask(ratio, adv, mask, scope=scope)
    assert torch.equal(new, reference_veto(ratio, adv, mask, 1e-4, scope))
    assert torch.equal(dropped, (mask != 0) & (new == 0))


# -- GCPO (§6.2) ------------------------------------------------------------------------------


def gcpo_inputs(seed, n=3, t=5):
    g = torch.Generator().manual_seed(seed)
    golden = torch.randn(t, generator=g, dtype=torch.float64) - 1
    fail = torch.randn(n, t, generator=g, dtype=torch.float64) - 1
    g_mask = torch.ones(t, dtype=torch.float64)
    g_mask[-1] = 0
    f_mask = (torch.rand(n, t, generator=g) < 0.8).to(torch.float64)
    f_mask[:, 0] = 1
    return golden, g_mask, fail, f_mask


def margin_of(golden, g_mask, fail, f_mask):
    g_mean = (golden * g_mask).sum() / g_mask.sum()
    f_mean = ((fail * f_mask).sum(-1) / f_mask.sum(-1)).mean()
    return g_mean - f_mean


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_with_all_gates_open_the_gated_loss_is_minus_the_margin_and_its_gradient(seed):
    golden, g_mask, fail, f_mask = gcpo_inputs(seed)
    g_lp, f_lp = golden.clone().requires_grad_(), fail.clone().requires_grad_()
    loss, stats = gcpo_loss(g_lp, golden, g_mask, f_lp, fail, f_mask)
    loss.backward()
    g_ref, f_ref = golden.clone().requires_grad_(), fail.clone().requires_grad_()
    margin = margin_of(g_ref, g_mask, f_ref, f_mask)
    margin.backward()
    assert loss.item() == pytest.approx(-margin.item())
    assert stats["margin"] == pytest.approx(margin.item()) and stats["gate_closed_frac"] == 0.0
    assert torch.allclose(g_lp.grad, -g_ref.grad) and torch.allclose(f_lp.grad, -f_ref.grad)


def test_closed_gates_remove_exactly_their_tokens_gradient_and_ratios_never_weight_it():
    golden_old = torch.zeros(1, 4, dtype=torch.float64)
    fail_old = torch.zeros(2, 4, dtype=torch.float64)
    golden = torch.tensor([[0.5, 0.0, 0.1, 0.0]], dtype=torch.float64, requires_grad=True)  # rho 1.65 closes
    fail = torch.tensor([[-0.5, 0.0, 0.0, 0.1], [0.0] * 4], dtype=torch.float64, requires_grad=True)
    loss, stats = gcpo_loss(golden, golden_old, torch.ones(1, 4), fail, fail_old, torch.ones(2, 4))
    loss.backward()
    assert golden.grad[0].tolist() == pytest.approx([0.0, -0.25, -0.25, -0.25])
    assert fail.grad.flatten().tolist() == pytest.approx([0.0, 0.125, 0.125, 0.125] + [0.125] * 4)
    assert stats["golden_gate_closed_frac"] == pytest.approx(0.25)
    assert stats["fail_gate_closed_frac"] == pytest.approx(1 / 8)
    assert stats["gate_closed_frac"] == pytest.approx(2 / 12)


def test_logsigmoid_form_is_minus_log_sigmoid_of_the_scaled_margin():
    golden, g_mask, fail, f_mask = gcpo_inputs(7)
    loss, stats = gcpo_loss(golden, golden, g_mask, fail, fail, f_mask, form="logsigmoid", beta_c=2.0)
    margin = margin_of(golden, g_mask, fail, f_mask).item()
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-2.0 * margin))))
    assert stats["margin"] == pytest.approx(margin)


def test_golden_as_a_row_or_a_vector_gives_the_same_loss():
    golden, g_mask, fail, f_mask = gcpo_inputs(3)
    flat, _ = gcpo_loss(golden, golden, g_mask, fail, fail, f_mask)
    row, _ = gcpo_loss(golden[None], golden[None], g_mask[None], fail, fail, f_mask)
    assert flat.item() == row.item()


# -- DAPO (§2) --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "length, want", [(0, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0), (21, -1.0), (100, -1.0)]
)
def test_overlong_penalty_is_zero_then_linear_then_minus_phi(length, want):
    assert dapo_overlong_penalty(length, max_len=20, cache_len=4) == pytest.approx(want)


@settings(max_examples=60, deadline=None)
@given(max_len=st.integers(1, 30000), data=st.data(), phi=st.floats(0.1, 2.0))
def test_overlong_penalty_matches_the_areal_formula_up_to_max_len(max_len, data, phi):
    cache = data.draw(st.integers(1, max_len))
    length = data.draw(st.integers(0, max_len))
    areal = min(-(length - (max_len - cache)) / cache * phi, 0.0)
    assert dapo_overlong_penalty(length, max_len, cache, phi) == pytest.approx(areal)


def test_overlong_penalty_without_a_cache_is_a_hard_cliff():
    assert dapo_overlong_penalty(20, 20, 0) == 0.0 and dapo_overlong_penalty(21, 20, 0) == -1.0
    with pytest.raises(ValueError, match="cache_len"):
        dapo_overlong_penalty(5, 20, 30)


def test_dynamic_sampling_keeps_only_mixed_groups():
    assert dapo_keep_group([True, False, False])
    assert not dapo_keep_group([False, False])
    assert not dapo_keep_group([1.0, 1.0])
    assert dapo_keep_group(torch.tensor([0.0, 1.0]))
    assert not dapo_keep_group([])
