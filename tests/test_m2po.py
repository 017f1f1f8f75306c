"""M2PO's second-moment mask and loss (learner/losses.py, docs/ALGORITHMS.md 8.2c) and the naive
baseline (8.2d), against hand-computed values and the paper's Algorithm 1 run literally; then
inside a real policy update (learner/update.py, a plain optimizer behind DeepSpeed's calls)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.losses import m2po_keep, m2po_token_loss
from protocol.config import LossConfig
from tests.test_update_variants import model, row, run  # noqa: F401 (model is a fixture)

# two rows: advantage +1 and -1; the log-ratios log pi_theta - log pi_behav of their 3 tokens
LOG_RATIO = [[0.5, 0.1, -0.3], [-0.4, 0.2, -0.05]]


def algorithm_1(log_ratio, adv, mask, tau):
    """The paper's Algorithm 1 as written: the trust-region tokens are those with A > 0 and
    r > 1 or A < 0 and r < 1; while their mean (log r)^2 exceeds tau, mask the largest."""
    b, t = log_ratio.shape
    trust = [(i, j) for i in range(b) for j in range(t) if mask[i][j] and (
        (adv[i] > 0 and log_ratio[i][j] > 0) or (adv[i] < 0 and log_ratio[i][j] < 0))]
    keep = [[True] * t for _ in range(b)]
    m2 = {ij: float(log_ratio[ij]) ** 2 for ij in trust}
    while trust and sum(m2[ij] for ij in trust) / len(trust) > tau:
        worst = max(trust, key=lambda ij: m2[ij])
        keep[worst[0]][worst[1]] = False
        trust.remove(worst)
    return keep


def test_the_mask_removes_the_largest_trust_region_tokens_until_their_mean_is_below_tau():
    log_ratio = torch.tensor(LOG_RATIO, dtype=torch.float64)
    adv, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 3)
    keep, trust, stats = m2po_keep(log_ratio, adv, mask, tau=0.04)
    # trust region: row 0 (A > 0) tokens with r > 1: 0.5, 0.1; row 1 (A < 0) with r < 1: -0.4,
    # -0.05. M2 = .25, .01, .16, .0025: mean .1056 > .04, drop .25 -> mean .0575, drop .16 ->
    # mean .00625 <= .04: stop
    assert trust.tolist() == [[True, True, False], [True, False, True]]
    assert keep.tolist() == [[False, True, True], [False, True, True]]
    assert stats == pytest.approx({"tokens": 4, "masked": 2, "m2_before": 0.4225,
                                   "m2_after": 0.0125})


def test_the_loss_is_the_unclipped_ratio_times_the_advantage_on_kept_tokens_with_its_gradient():
    behav = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor(LOG_RATIO, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, keep, _ = m2po_token_loss(logp, behav, adv, torch.ones(2, 3), tau=0.04)
    e = math.exp
    # no clip: row 0 token 2 has r = e^-0.3 < 0.8 and A > 0 (outside the trust region), row 1
    # token 1 has r = e^0.2 = 1.22 > 1.2 and A < 0: both keep the plain -A r
    want = [[0.0, -e(0.1), -e(-0.3)], [0.0, e(0.2), e(-0.05)]]
    assert loss.flatten().tolist() == pytest.approx(sum(want, []))
    loss.sum().backward()
    # d(-A r)/d log pi = -A r on kept tokens; a masked token has no gradient
    assert logp.grad.flatten().tolist() == pytest.approx(sum(want, []))


def test_tokens_outside_the_loss_and_rows_without_advantage_are_never_in_the_trust_region():
    log_ratio = torch.tensor([[2.0, 2.0], [3.0, -3.0]], dtype=torch.float64)
    adv, mask = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([[1, 0], [1, 1]])
    keep, trust, stats = m2po_keep(log_ratio, adv, mask, tau=0.04)
    assert trust.tolist() == [[True, False], [False, False]]
    assert keep.tolist() == [[False, True], [True, True]]
    assert stats["tokens"] == 1 and stats["masked"] == 1


def test_tau_must_be_positive():
    with pytest.raises(ValueError, match="tau"):
        m2po_keep(torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), tau=0.0)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 5), t=st.integers(1, 9),
       scale=st.sampled_from([0.05, 0.3, 1.0, 3.0]), tau=st.sampled_from([0.01, 0.04, 0.5]))
def test_the_mask_is_the_papers_algorithm_1(seed, b, t, scale, tau):
    g = torch.Generator().manual_seed(seed)
    log_ratio = torch.randn(b, t, generator=g, dtype=torch.float64) * scale
    adv = torch.randn(b, generator=g, dtype=torch.float64).round()  # some zeros
    mask = torch.rand(b, t, generator=g) < 0.8
    keep, _, stats = m2po_keep(log_ratio, adv, mask, tau)
    assert keep.tolist() == algorithm_1(log_ratio, adv.tolist(), mask.tolist(), tau)
    kept_trust = stats["tokens"] - stats["masked"]
    assert kept_trust == 0 or stats["m2_after"] / kept_trust <= tau + 1e-12


# -- inside a policy update -------------------------------------------------------------------


M2PO = LossConfig(old_policy="behaviour", trust_region="m2po", aggregation="token-mean")


def test_masked_tokens_stay_in_the_denominator_and_the_metrics_say_what_was_masked(model):
    # row 0: stored log-probs 0.5 below the policy's, A > 0: r = e^0.5 on 3 trust-region tokens,
    # M2 = .25 each, so all are masked; row 1: the behaviour is the policy itself (r = 1)
    m = run(model, [row(model, 1.0, shift=-0.5), row(model, 1.0)], M2PO)
    # token-mean over all 6 response tokens: -(0 + 3 x 1 x 1) / 6 (not / 3, the kept ones)
    assert m["loss"] == pytest.approx(-0.5, abs=1e-5)
    assert m["m2po/masked_frac"] == pytest.approx(0.5)
    assert m["m2po/trust_frac"] == pytest.approx(0.5)
    assert m["m2po/m2_before"] == pytest.approx(0.25, abs=1e-5)
    assert m["m2po/m2_after"] is None  # no trust-region token left
    assert m["pg/clip_frac"] == 0


def test_m2po_does_not_clip_a_ratio_the_ppo_clip_would(model):
    # r = e^0.19 = 1.209 > 1 + 0.2 with A > 0, but M2 = 0.0361 <= tau: nothing is masked and the
    # loss is -r, where the PPO clip on the same row stops at -1.2
    m = run(model, [row(model, 1.0, shift=-0.19)], M2PO)
    assert m["m2po/masked_frac"] == 0 and m["m2po/trust_frac"] == 1
    assert m["loss"] == pytest.approx(-math.exp(0.19), abs=1e-5)
    clipped = run(model, [row(model, 1.0, shift=-0.19)], LossConfig(old_policy="behaviour"))
    assert clipped["loss"] == pytest.approx(-1.2, abs=1e-5)


def test_the_naive_objective_is_the_ppo_clip_on_the_ratio_to_the_behaviour_policy(model):
    rows = [row(model, 1.0, shift=-0.5), row(model, -1.0, shift=0.5), row(model, 1.0, shift=0.1)]
    naive = run(model, rows, LossConfig(old_policy="behaviour"))
    # per token: A=+1, r=e^.5=1.65 -> -min(r, 1.2) = -1.2 (clipped); A=-1, r=e^-.5=.61 ->
    # max(r, 0.8) = 0.8 (clipped); A=+1, r=e^-.1 -> -r. Sequence means, then their mean.
    want = (-1.2 + 0.8 - math.exp(-0.1)) / 3
    assert naive["loss"] == pytest.approx(want, abs=1e-5)
    assert naive["pg/clip_frac"] == pytest.approx(6 / 9)
    assert naive["is/w_mean"] == pytest.approx(1.0)
    # decoupled PPO (the default) ratios to the step-start policy instead: r = 1, w truncated
    decoupled = run(model, rows, LossConfig())
    assert decoupled["loss"] != pytest.approx(want, abs=1e-3)
    assert decoupled["pg/clip_frac"] == 0
