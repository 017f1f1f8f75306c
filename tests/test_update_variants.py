"""The policy update's variants (learner/update.py): ratio to behaviour vs proximal policy, the
Mu-GRPO veto inside a real step, and the GCPO term. A plain torch optimizer stands in for
DeepSpeed behind the same four calls the update makes."""

import copy
import math

import pytest
import torch

from tasks.tiny_model import build_model, build_tokenizer
from learner.batch import pack
from learner.logprobs import token_logp
from learner.update import (ContrastGroup, LossRow, UpdateSpec, contrast_batches, policy_update,
                            ratio_terms)
from protocol.config.algorithms import GCPOConfig, MuGRPOConfig
from protocol.config import LossConfig
from tests.sgd_engine import SGDEngine

PROMPT, RESPONSE = [3, 4], [5, 6, 7]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(build_tokenizer(), hidden=32, layers=1, heads=2, ffn=64).eval()


def own_logp(model, response=RESPONSE) -> list[float]:
    """The model's own log-probs of `response`: a behaviour policy equal to the current one."""
    packed = pack([LossRow(PROMPT, response, [0.0] * len(response), 0.0, 0)], 0)
    with torch.no_grad():
        logp, _ = token_logp(model, packed)
    return logp[0][packed.mask[0] != 0].tolist()


def row(model, adv, shift=0.0, **kw) -> LossRow:
    return LossRow(PROMPT, RESPONSE, [x + shift for x in own_logp(model)], adv, 0, **kw)


def run(model, rows, loss_cfg, micro_batch=64, contrasts=(), **kw) -> dict:
    spec = UpdateSpec(loss_cfg, max_new_tokens=8, micro_batch=micro_batch, lr=0.5, **kw)
    return policy_update(SGDEngine(copy.deepcopy(model), 0.5), rows, spec, 0, contrasts)


FRESH, RECOMPUTED, REPLAYED = (torch.tensor([[True], [False], [False]]),
                               torch.tensor([[False], [True], [False]]),
                               torch.tensor([[False], [False], [True]]))


def test_ratio_to_behaviour_uses_stored_logprobs_and_weight_one():
    prox, behav = torch.zeros(3, 2), torch.full((3, 2), -1.0)
    old, w, keep, _ = ratio_terms(prox, behav, RECOMPUTED, REPLAYED,
                                  LossConfig(old_policy="behaviour"))
    assert old.tolist() == [[-1.0] * 2, [0.0] * 2, [-1.0] * 2]  # recomputed rows: to pi_prox
    assert w.eq(1).all() and keep.all()


def test_the_proximal_ratio_truncates_the_weight_of_fresh_rows_and_replays_against_storage():
    prox, behav = torch.zeros(3, 2), torch.full((3, 2), -5.0)
    old, w, _, truncated = ratio_terms(prox, behav, RECOMPUTED, REPLAYED, LossConfig())
    # fresh: u to pi_prox, w = min(e^5, 2); policy-recomputed: to pi_prox, w = 1; direct
    # replay (3.5): ratioed to its stored log-probs, w = 1
    assert old.tolist() == [[0.0] * 2, [0.0] * 2, [-5.0] * 2]
    assert w.tolist() == [[2.0] * 2, [1.0] * 2, [1.0] * 2]
    assert truncated.tolist() == [[True] * 2, [False] * 2, [False] * 2]


def test_stale_rows_whose_weights_average_to_one_show_in_the_weights_distance_from_one(model):
    # behaviour 0.1 nat below and above the proximal policy on every token: weights e^0.1 and
    # e^-0.1, whose mean is 1.005 (a mean weight near 1 says nothing of staleness)
    m = run(model, [row(model, 1.0, shift=-0.1), row(model, -1.0, shift=0.1)], LossConfig())
    assert m["is/w_mean"] == pytest.approx((math.exp(0.1) + math.exp(-0.1)) / 2, rel=1e-5)
    assert m["is/w_absdev"] == pytest.approx((math.exp(0.1) - math.exp(-0.1)) / 2, rel=1e-5)
    on_policy = run(model, [row(model, 1.0), row(model, -1.0)], LossConfig())
    assert on_policy["is/w_absdev"] == pytest.approx(0.0, abs=1e-6)


def test_a_policy_recomputed_row_is_trained_with_weight_one_however_stale_its_logprobs(model):
    m = run(model, [row(model, 1.0, shift=-5.0, reuse="policy_recomputed")], LossConfig())
    assert m["is/w_mean"] == pytest.approx(1.0) and m["is/w_truncated_frac"] == 0
    assert m["pg/clip_frac"] == 0  # its ratio starts at 1 (3.5)


def test_a_direct_replay_row_far_from_its_stored_logprobs_is_clipped(model):
    # stored log-probs 5 nats above the current policy's: ratio e^-5, far below 1 - 0.2, and
    # a negative advantage: the clipped branch is active on every token (3.5)
    m = run(model, [row(model, -1.0, shift=5.0, reuse="direct_replay")], LossConfig())
    assert m["pg/clip_frac"] == 1.0 and m["is/w_mean"] == pytest.approx(1.0)
    assert m["grad_norm"] == 0.0


def veto_cfg(delta):
    return MuGRPOConfig(veto_scope="suffix", veto_delta=delta)


def test_the_veto_keeps_only_tokens_up_to_the_first_trigger_of_negative_responses(model):
    loss_cfg = LossConfig(old_policy="behaviour", aggregation="token-mean", clip_low=1.0,
                          clip_high=4.0)
    rows = [row(model, 1.0), row(model, -1.0)]
    m = run(model, rows, loss_cfg, veto=veto_cfg(2.0))  # ratio 1 < 2: every token triggers
    assert m["veto/resp_frac"] == 1.0 and m["veto/token_frac"] == pytest.approx(2 / 3)
    assert m["veto/token_frac_all"] == pytest.approx(2 / 6)
    # ratio 1: loss = -(3 x (+1) + 1 x (-1)) / 4 kept tokens; vetoed tokens leave the denominator
    assert m["loss"] == pytest.approx(-0.5, abs=1e-5)


def test_no_token_is_vetoed_while_the_policy_stays_near_its_behaviour(model):
    loss_cfg = LossConfig(old_policy="behaviour", aggregation="token-mean")
    m = run(model, [row(model, 1.0), row(model, -1.0)], loss_cfg, veto=veto_cfg(1e-4))
    assert m["veto/token_frac"] == 0 and m["veto/resp_frac"] == 0


def test_the_vetoed_loss_does_not_depend_on_the_micro_batch_split(model):
    loss_cfg = LossConfig(old_policy="behaviour", aggregation="token-mean")
    rows = [row(model, a, shift=s) for a, s in [(1.0, 0.3), (-1.0, 0.0), (-0.5, -0.2), (2.0, 0.1)]]
    whole = run(model, rows, loss_cfg, micro_batch=64, veto=veto_cfg(1.1))
    split = run(model, rows, loss_cfg, micro_batch=1, veto=veto_cfg(1.1))
    assert whole["veto/token_frac"] > 0
    assert split["loss"] == pytest.approx(whole["loss"], abs=1e-6)


def test_gcpo_raises_the_margin_between_the_golden_and_the_failures(model):
    contrast = ContrastGroup(PROMPT, [9, 10, 1], [[11, 12, 1], [13, 1]])
    m = run(model, [], LossConfig(), contrasts=[contrast], gcpo=GCPOConfig(coef=1.0))
    assert m["gcpo/margin_after"] > m["gcpo/margin"]
    assert m["gcpo/gate_closed_frac"] == 0  # one optimizer step: the gates start open


def test_contrast_groups_are_batched_whole():
    groups = [ContrastGroup([1], [2], [[3]] * k) for k in (3, 3, 1)]
    assert contrast_batches(groups, max_seqs=6) == [[0], [1, 2]]
    assert contrast_batches(groups, max_seqs=1) == [[0], [1], [2]]
    # 4 rows of 2 tokens, then 2 rows: a padded-token budget of 8 holds one group at a time
    assert contrast_batches(groups, max_seqs=64, max_tokens=8) == [[0], [1], [2]]
    assert contrast_batches(groups, max_seqs=64, max_tokens=12) == [[0], [1, 2]]


def test_token_ratios_are_null_not_zero_when_no_token_enters_the_loss(model):
    m = run(model, [row(model, 0.0), row(model, 0.0)], LossConfig())
    assert m["is/w_mean"] is None and m["pg/clip_frac"] is None and m["grad_norm"] is None
