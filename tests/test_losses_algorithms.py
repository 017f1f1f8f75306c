"""Algorithm-specific loss terms (learner/losses.py): the Mu-GRPO veto (docs/ALGORITHMS.md §5.2-5.3),
GCPO's gated contrast (§6.2) and DAPO's overlong penalty and dynamic sampling (§2)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.losses import dapo_keep_group, dapo_overlong_penalty, gcpo_loss, veto_mask


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
