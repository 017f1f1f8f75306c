"""A learner step's optimizer steps (learner/update.py): mini-batches and epochs against a plain
reference, the KL term against a frozen reference model, GCPO's gates on later mini-batches.

The plain reference takes the same rows through the textbook computation: the whole batch's
full-vocabulary logits, one mini-batch at a time, no micro-batches, no ranks, no chunks. A plain
torch optimizer stands in for DeepSpeed behind the four calls the update makes."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from learner.batch import mini_batches, pack
from learner.logprobs import full_logits_logp
from learner.update import ContrastGroup, LossRow, UpdateSpec, policy_update
from protocol.config.algorithms import GCPOConfig
from protocol.config import LossConfig
from tests.sgd_engine import SGDEngine
from tasks.tiny_model import build_model, build_tokenizer

LR = 1.0


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(build_tokenizer(), hidden=32, layers=1, heads=2, ffn=64).eval()


def make_rows(model, n_groups=8, group=4, seed=0) -> list[LossRow]:
    """Groups of rows with mixed advantages (one zero-advantage group) and behaviour log-probs
    near the model's own (w near 1, not equal)."""
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups):
        prompt = [rng.randrange(5, 90) for _ in range(rng.randrange(2, 5))]
        for k in range(group):
            resp = [rng.randrange(5, 90) for _ in range(rng.randrange(1, 6))]
            probe = pack([LossRow(prompt, resp, [0.0] * len(resp), 0.0, 0)], 0)
            with torch.no_grad():
                own = full_logits_logp(model, probe)[0][0][probe.mask[0] != 0]
            adv = 0.0 if g == 0 else rng.choice([-1.0, -0.5, 0.5, 1.0])
            rows.append(LossRow(prompt, resp, [x + rng.uniform(-0.3, 0.3) for x in own.tolist()],
                                adv, 0, group_id=f"g{g}"))
    return rows


def plain_reference(model, rows, loss_cfg, mini_batches, epochs, lr=LR, deal=None):
    """Textbook decoupled PPO over mini-batches of whole groups: (losses, clipped tokens, loss
    tokens, weights after, (clipped, loss tokens) per optimizer step). pi_prox = the weights
    before the first mini-batch. deal(epoch): that pass's mini-batches (row indices); None =
    groups in arrival order, the same every pass."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    whole = pack(rows, 0)
    with torch.no_grad():
        prox_all, _ = full_logits_logp(model, whole)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.group_id, []).append(i)
    units = list(groups.values())
    size, extra = divmod(len(units), mini_batches)
    sets, at = [], 0
    for k in range(mini_batches):
        n = size + (k < extra)
        sets.append([i for u in units[at:at + n] for i in u])
        at += n
    losses, clipped, counted, per_step = [], 0, 0, []
    for epoch in range(epochs):
        for idx in (sets if deal is None else deal(epoch)):
            p = pack([rows[i] for i in idx], 0)
            prox = torch.zeros_like(p.mask)  # the whole batch's step-start log-probs, re-placed
            for b, i in enumerate(idx):
                r = rows[i]
                at_whole = len(r.prompt) - 1
                prox[b, at_whole:at_whole + len(r.response)] = \
                    prox_all[i, at_whole:at_whole + len(r.response)]
            logp, _ = full_logits_logp(model, p)
            ratio = torch.exp(logp - prox)
            w = torch.exp(prox - p.behav_logp).clamp(max=loss_cfg.behav_weight_cap)
            a = p.adv[:, None]
            lo, hi = 1 - loss_cfg.clip_low, 1 + loss_cfg.clip_high
            tok = -torch.min(ratio * a, ratio.clamp(lo, hi) * a) * w
            m = p.mask
            per_row = (tok * m).sum(-1) / m.sum(-1)
            loss = per_row.sum() / len(idx)  # seq-mean-token-mean over the mini-batch's rows
            step_clipped = int((((a > 0) & (ratio > hi)) | ((a < 0) & (ratio < lo)))[m != 0].sum())
            step_counted = int(m[(p.adv != 0)].sum())
            clipped, counted = clipped + step_clipped, counted + step_counted
            per_step.append((step_clipped, step_counted))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, clipped, counted, [q.detach() for q in model.parameters()], per_step


def update(model, rows, loss_cfg=LossConfig(), contrasts=(), reference=None, step=0, **kw):
    engine = SGDEngine(copy.deepcopy(model), LR)
    spec = UpdateSpec(loss_cfg, max_new_tokens=8, **{"micro_batch": 3, "lr": LR, **kw})
    return policy_update(engine, rows, spec, 0, contrasts, reference, step), engine


def assert_same_weights(engine, weights):
    for got, want in zip(engine.module.parameters(), weights):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-5)


def test_one_optimizer_step_equals_the_plain_reference_and_never_clips(model):
    rows = make_rows(model)
    m, engine = update(model, rows)
    losses, clipped, _, weights, _ = plain_reference(model, rows, LossConfig(), 1, 1)
    assert m["train/optimizer_steps"] == 1 and engine.steps == 1
    assert m["loss"] == pytest.approx(losses[0], abs=1e-6)
    assert m["pg/clip_frac"] == 0 == clipped  # u = pi_theta / pi_prox is exactly 1
    assert "timing/old_logp" not in m  # the forward is the proximal policy: no extra pass
    assert_same_weights(engine, weights)


@pytest.mark.parametrize("mini_batches, epochs", [(4, 1), (2, 2)])
def test_later_mini_batches_ratio_to_the_step_start_policy_and_clip(model, mini_batches, epochs):
    rows = make_rows(model)
    m, engine = update(model, rows, mini_batches=mini_batches, epochs=epochs)
    losses, clipped, counted, weights, _ = plain_reference(model, rows, LossConfig(),
                                                           mini_batches, epochs)
    assert m["train/optimizer_steps"] == engine.steps == mini_batches * epochs
    assert m["loss"] == pytest.approx(sum(losses) / len(losses), abs=1e-5)
    assert m["pg/clip_frac"] > 0
    assert m["pg/clip_frac"] == pytest.approx(clipped / counted)
    assert_same_weights(engine, weights)


def test_shuffled_passes_deal_whole_groups_afresh_and_train_like_the_reference(model):
    rows = make_rows(model)
    spec = UpdateSpec(LossConfig(), max_new_tokens=8, mini_batches=4, epochs=2, order_seed=7)
    deals = [mini_batches([r.group_id for r in rows], 4, spec.group_order(3, e)) for e in (0, 1)]
    assert deals[0] != deals[1]  # a fresh order each pass
    assert deals[0] != mini_batches([r.group_id for r in rows], 4, spec.group_order(4, 0))
    for sets in deals:  # every row once, groups whole
        assert sorted(i for s in sets for i in s) == list(range(len(rows)))
        assert all(len({rows[i].group_id for i in s}) == 2 for s in sets)
    m, engine = update(model, rows, mini_batches=4, epochs=2, order_seed=7, step=3)
    losses, clipped, counted, weights, per_step = plain_reference(
        model, rows, LossConfig(), 4, 2, deal=lambda e: deals[e])
    assert m["loss"] == pytest.approx(sum(losses) / len(losses), abs=1e-5)
    assert_same_weights(engine, weights)
    # where the clip acts, by optimizer step, and each mini-batch's mean response length
    assert m["mb/clip_frac"] == pytest.approx([c / t for c, t in per_step])
    assert m["mb/len_mean"] == pytest.approx(
        [sum(len(rows[i].response) for i in s) / len(s) for sets in deals for s in sets])


def test_token_metrics_have_one_denominator_whether_or_not_zero_advantage_rows_run_forward(
        model):
    rows = make_rows(model)  # group g0 has zero advantages and w != 1
    plain, _ = update(model, rows)
    # a negligible entropy bonus makes every row run forward; the metrics must not change
    forward_all, _ = update(model, rows, LossConfig(entropy_coef=1e-12))
    assert forward_all["train/rows_forward"] > plain["train/rows_forward"]
    for key in ("is/w_mean", "is/w_truncated_frac", "policy/entropy", "pg/clip_frac"):
        assert forward_all[key] == pytest.approx(plain[key], rel=1e-6, abs=1e-12), key


def test_staleness_in_optimizer_steps_counts_every_update_since_the_sampling_weights(model):
    from dataclasses import replace

    rows = make_rows(model)  # 7 groups with gradient, sampled by version 0
    rows = [replace(r, policy_version=1) if r.group_id == "g7" else r for r in rows]
    m, _ = update(model, rows, mini_batches=4, epochs=2, step=2)
    # version 0 trained in learner step 2 of 8 optimizer steps each: 16 behind at the first,
    # 23 at the last optimizer step; g7 (version 1) is 8 fewer
    assert m["stale/optimizer_steps_max"] == 23
    one, _ = update(model, rows, step=2)
    assert one["stale/optimizer_steps_max"] == 2  # one optimizer step per learner step


def test_the_behaviour_weight_stays_the_step_start_correction_on_every_mini_batch(model):
    rows = make_rows(model)
    one, _ = update(model, rows)
    four, _ = update(model, rows, mini_batches=4, epochs=2)
    # w = pi_prox / pi_behav is fixed for the learner step, so its mean over the loss tokens of
    # every optimizer step is the one-step value
    assert four["is/w_mean"] == pytest.approx(one["is/w_mean"], rel=1e-5)
    assert four["is/w_mean"] != pytest.approx(1.0, abs=1e-3)


def test_a_mini_batch_without_gradient_takes_no_optimizer_step(model):
    rows = make_rows(model, n_groups=2)  # group 0 has zero advantage: its mini-batch is empty
    m, engine = update(model, rows, mini_batches=2)
    assert m["train/optimizer_steps"] == engine.steps == 1


def test_kl_to_the_frozen_reference_is_zero_at_the_start_and_grows(model):
    rows = make_rows(model)
    reference = copy.deepcopy(model).requires_grad_(False)
    engine = SGDEngine(copy.deepcopy(model), 0.3)
    spec = UpdateSpec(LossConfig(kl_beta=0.1), max_new_tokens=8, micro_batch=3, lr=0.3)
    kl = [policy_update(engine, rows, spec, 0, (), reference)["kl/mean"] for _ in range(3)]
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # the policy is still the reference
    assert 0 < kl[1] < kl[2]


def test_the_kl_term_adds_beta_times_its_aggregate_to_the_loss(model):
    rows = make_rows(model)
    reference = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():  # zero weights: a uniform reference, far from the policy
        for p in reference.parameters():
            p.zero_()
    token_mean = dict(aggregation="token-mean")  # then the KL aggregate is kl/mean itself
    plain, _ = update(model, rows, LossConfig(kl_beta=0.5, kl_kind="k1", **token_mean),
                      reference=reference)
    without, _ = update(model, rows, LossConfig(entropy_coef=1e-9, **token_mean))  # same rows
    assert abs(plain["kl/mean"]) > 1e-3
    assert plain["loss"] == pytest.approx(without["loss"] + 0.5 * plain["kl/mean"], abs=1e-5)


def test_kl_without_a_reference_model_is_refused(model):
    with pytest.raises(ValueError, match="reference"):
        update(model, make_rows(model), LossConfig(kl_beta=0.1))


def test_gcpo_gates_close_on_later_mini_batches_once_the_ratio_passes_one_plus_eps(model):
    contrast = ContrastGroup([3, 4], [9, 10, 1], [[11, 12, 1], [13, 1]])
    gcpo = GCPOConfig(coef=1.0, eps_c=0.05)
    one, _ = update(model, [], contrasts=[contrast] * 4, gcpo=gcpo)
    many, _ = update(model, [], contrasts=[contrast] * 4, gcpo=gcpo, mini_batches=4)
    assert one["gcpo/gate_closed_frac"] == 0  # a single optimizer step: the gates start open
    assert many["gcpo/gate_closed_frac"] > 0
    assert many["gcpo/margin"] == pytest.approx(one["gcpo/margin"], abs=1e-6)  # step start


@pytest.mark.parametrize("override, key", [
    ("optim.mini_batches=0", "optim.mini_batches"), ("optim.epochs=0", "optim.epochs"),
    ("optim.mini_batches=33", "optim.mini_batches"),  # more than the 32 groups of a step
    ("learner.micro_batch=0", "learner.micro_batch"),
    ("learner.max_tokens_per_micro_batch=8", "learner.max_tokens_per_micro_batch"),
    ("loss.kl_beta=-0.1", "loss.kl_beta")])
def test_update_values_that_would_do_nothing_or_divide_by_zero_are_refused(override, key):
    from protocol.config import ConfigError, load_config
    from tests.conftest import TINY

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(TINY, [override])


def test_the_update_takes_the_sampling_temperature_and_the_papers_knobs_from_the_config():
    from protocol.config import load_config
    from tests.conftest import TINY

    spec = UpdateSpec.of(load_config(TINY, ["rollout.temperature=0.7", "optim.mini_batches=4",
                                            "learner.max_tokens_per_micro_batch=512"]))
    assert (spec.temperature, spec.mini_batches, spec.max_tokens) == (0.7, 4, 512)


def test_the_real_model_configs_take_the_papers_optimizer_steps_and_a_token_budget():
    from pathlib import Path

    from protocol.config import load_config

    configs = Path(__file__).resolve().parents[1] / "configs"
    for name in ("qwen2.5-7b-grpo.yaml", "qwen2.5-7b-ar3po.yaml"):
        cfg = load_config(configs / name)
        assert (cfg.optim.mini_batches, cfg.optim.epochs) == (16, 1)  # DAPO's 16 updates
        assert cfg.rollout.prompts_per_step // cfg.optim.mini_batches == 32  # 32 prompts each
        assert cfg.learner.max_tokens_per_micro_batch >= cfg.actors.max_model_len
    aero = load_config(configs / "qwen2.5-math-1.5b-aero.yaml")
    assert aero.optim.epochs == 1  # AERO Table 9: GRPO epochs 1
    assert aero.learner.max_tokens_per_micro_batch >= aero.actors.max_model_len
