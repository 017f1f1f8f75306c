"""The loss of one forward/backward micro-batch (docs/ALGORITHMS.md 1.3-1.7, 3.5, 5.2, 6.2, 8.3-8.4).

The ratio's denominator is chosen by `loss.old_policy` and by how a row's stored log-probs may
be used (`LossRow.reuse`):
  proximal  (decoupled PPO, 8.3): u = pi_theta / pi_prox, with pi_prox the learner's weights at
            the start of the learner step (learner/update.py computes them once, before the
            first optimizer step; with a single optimizer step they are this forward's own,
            detached, and u is 1 in value), and w = sg(pi_prox / pi_behav) truncated or masked
            at `behav_weight_cap` corrects for the actor's (possibly stale) sampling weights.
  behaviour (Mu-GRPO, 5.2): the stored behaviour log-probs are the denominator, w = 1.
  A policy-recomputed reused response (8.4) has no valid correction: ratio to pi_prox, w = 1.
  A direct-replay reused response (3.5) is ratioed to its stored log-probs from v_origin, w = 1,
  so the clip acts against the old policy that wrote it.
Under `loss.trust_region: m2po` (8.2c) the ratio to the behaviour policy is not clipped: the
tokens M2PO's second-moment mask takes out give 0 and stay in the denominators.
With `mugrpo.veto_scope` on, the negative-advantage veto (5.2) masks tokens from triggers of
pi_theta / pi_behav, the current weights (8.4). The KL term (1.5) compares pi_theta with the
frozen reference's log-probs over the same loss tokens, with the same aggregation.
Every term is aggregated with the optimizer step's global denominators (1.4), so micro-batch
losses add up to the mini-batch's loss. Each returns its metric sums; the caller reduces them.

Run the tests with: python -m pytest tests/test_update_variants.py tests/test_update_steps.py
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from learner.batch import Row, on_responses, pack, tokens
from learner.logprobs import model_device, token_logp
from learner.losses import (aggregate, behaviour_weights, gcpo_loss, kl_penalty, m2po_token_loss,
                            ppo_token_loss, veto_mask)
from protocol.config import LossConfig, MuGRPOConfig

if TYPE_CHECKING:
    from learner.update_spec import UpdateSpec


@dataclass(frozen=True)
class LossRow(Row):
    reuse: Literal["", "policy_recomputed", "direct_replay"] = ""
    """How the stored log-probs enter the ratio (docs/ALGORITHMS.md 3.5, 8.4). "": a fresh sample's
    behaviour log-probs (w = pi_prox / pi_behav; the denominator under old_policy=behaviour).
    "policy_recomputed": a reused response whose stored log-probs are no valid correction
    (ratio to pi_prox, w = 1). "direct_replay": a reused response whose stored log-probs, from
    v_origin, are the ratio's denominator (w = 1)."""


@dataclass(frozen=True)
class ContrastGroup:
    """An all-fail group with a verified golden trajectory, for the GCPO term (6.2)."""

    prompt: list[int]
    golden: list[int]  # golden response token ids (eos included)
    failures: list[list[int]]  # the group's fresh failed responses

    def rows(self) -> list[Row]:
        """[golden, failures...] as rows (the GCPO term uses no stored log-probs)."""
        return [Row(self.prompt, r, [0.0] * len(r), 0.0, 0) for r in (self.golden, *self.failures)]


@dataclass(frozen=True)
class Denominators:
    """An optimizer step's global loss denominators (1.4), over every rank's micro-batches."""

    num_seqs: int  # rows of the mini-batch, zero-advantage ones included
    num_tokens: int  # their loss tokens (masked-out ones excluded)


def ratio_terms(prox: torch.Tensor, behav: torch.Tensor, recomputed: torch.Tensor,
                replayed: torch.Tensor, loss_cfg: LossConfig) -> tuple[torch.Tensor, ...]:
    """(old_logp, w, keep, truncated), all (B, T): the ratio's denominator and the behaviour
    weight per token. prox, behav: (B, T) detached; recomputed, replayed: (B, 1) bool, the rows
    that are policy-recomputed / direct-replay reused responses."""
    ones, none = torch.ones_like(prox), torch.zeros_like(prox, dtype=torch.bool)
    match loss_cfg.old_policy:
        case "behaviour":
            return torch.where(recomputed, prox, behav), ones, ~none, none
        case "proximal":
            old = torch.where(replayed, behav, prox)
            if loss_cfg.behav_weight_mode == "off":
                return old, ones, ~none, none
            fresh = ~(recomputed | replayed)
            w, keep, truncated = behaviour_weights(prox, behav, loss_cfg.behav_weight_cap,
                                                   loss_cfg.behav_weight_mode)
            return old, torch.where(fresh, w, ones), keep | ~fresh, truncated & fresh


def loss_masks(current, prox, packed, rows_k, loss_cfg: LossConfig, veto: MuGRPOConfig | None):
    """Ratio terms and the loss mask of one micro-batch, veto applied; plus the veto tensors.
    current: this forward's log-probs, detached; prox: the proximal ones (B, T)."""
    kinds = [r.reuse if isinstance(r, LossRow) else "" for r in rows_k]
    device = packed.mask.device
    recomputed = torch.tensor([k == "policy_recomputed" for k in kinds], device=device)[:, None]
    replayed = torch.tensor([k == "direct_replay" for k in kinds], device=device)[:, None]
    old, w, keep, truncated = ratio_terms(prox, packed.behav_logp, recomputed, replayed, loss_cfg)
    mask = packed.mask * keep.to(packed.mask.dtype)
    trig = dropped = None
    if veto is not None:  # triggers on pi_theta / pi_behav, the data-generating policy (8.4)
        ratio = torch.exp(current - packed.behav_logp)
        mask, trig, dropped = veto_mask(ratio, packed.adv, mask, veto.veto_delta,
                                        veto.veto_scope)
    return old, w, truncated, mask, trig, dropped


def _proximal(rows_k, prox_k, like: torch.Tensor) -> torch.Tensor:
    """The step-start log-probs (B, T-1), or this forward's own (detached) when not given."""
    if prox_k is None:
        return like.detach()
    return on_responses(rows_k, prox_k, like.shape[1], like.device)


@torch.no_grad()
def dropped_tokens(model, rows_k: list[Row], prox_k, spec: UpdateSpec, pad_id: int) -> int:
    """Loss tokens of one micro-batch that the IS-cap mask and the veto drop, with the current
    weights: the token-mean denominator leaves them out (1.4). Runs a forward only for the veto."""
    packed = pack(rows_k, pad_id).to(model_device(model))
    current = packed.behav_logp
    if spec.veto is not None:
        current, _ = token_logp(model, packed, spec.temperature)
    prox = _proximal(rows_k, prox_k, current)
    mask = loss_masks(current, prox, packed, rows_k, spec.loss, spec.veto)[3]
    return int(((packed.mask != 0) & (mask == 0)).sum())


def pg_loss(model, rows_k: list[Row], prox_k, ref_k, spec: UpdateSpec, pad_id: int,
            den: Denominators) -> tuple[torch.Tensor, Counter]:
    """The policy-gradient loss of one micro-batch (its share of the optimizer step's mean),
    with the entropy bonus and the KL term, and its metric sums (learner/update.py sums them
    over micro-batches and ranks); prox_k, ref_k: per-row step-start and reference log-probs
    of the response tokens, or None."""
    lc, sums = spec.loss, Counter()
    packed = pack(rows_k, pad_id).to(model_device(model))
    logp, entropy = token_logp(model, packed, spec.temperature, entropy=True,
                               entropy_grad=lc.entropy_coef > 0)
    prox = _proximal(rows_k, prox_k, logp)
    old, w, truncated, mask, trig, dropped = loss_masks(logp.detach(), prox, packed, rows_k, lc,
                                                        spec.veto)
    if lc.trust_region == "m2po":  # no clip: the second-moment mask bounds the ratio (8.2c)
        loss_tok, _, m2 = m2po_token_loss(logp, old, packed.adv, mask, lc.m2po_tau)
        c_low = c_high = torch.zeros_like(mask, dtype=torch.bool)
        for key in ("tokens", "masked", "m2_before", "m2_after"):
            sums[f"m2po_{key}"] += m2[key]
    else:
        loss_tok, c_low, c_high = ppo_token_loss(logp, old, packed.adv, lc.clip_low,
                                                 lc.clip_high, lc.dual_clip)

    def agg(values: torch.Tensor) -> torch.Tensor:
        return aggregate(values, mask, lc.aggregation, den.num_seqs, den.num_tokens,
                         spec.max_new_tokens)

    loss = agg(loss_tok * w * packed.scale[:, None])
    if lc.entropy_coef > 0:
        loss = loss - lc.entropy_coef * agg(entropy)
    # the token metrics' one denominator: response tokens of rows that carry policy gradient
    # (advantage != 0), whether or not KL or entropy make zero-advantage rows run forward too
    m = packed.mask * (packed.adv != 0).to(packed.mask.dtype)[:, None]
    if ref_k is not None:
        kl = kl_penalty(logp, on_responses(rows_k, ref_k, m.shape[1], m.device), lc.kl_kind)
        loss = loss + lc.kl_beta * agg(kl)
        sums["kl"] += (kl.detach() * mask).sum().item()  # over the tokens the KL term acts on
        sums["kl_tokens"] += mask.sum().item()
    sums["loss"] += loss.item()
    sums["clip_low"] += (c_low * m).sum().item()
    sums["clip_high"] += (c_high * m).sum().item()
    sums["w"] += (w * m).sum().item()
    sums["w_absdev"] += ((w - 1).abs() * m).sum().item()
    sums["w_trunc"] += (truncated * m).sum().item()
    sums["entropy"] += (entropy.detach() * m).sum().item()
    sums["tokens"] += m.sum().item()
    sums["train_tokens"] += int(packed.attention.sum().item())
    if spec.veto is not None:
        neg = (packed.adv < 0)[:, None] & (m != 0)  # (B, T) loss tokens of negative responses
        sums["vetoed"] += dropped.sum().item()
        sums["neg_tokens"] += neg.sum().item()
        sums["neg_rows"] += neg.any(dim=-1).sum().item()
        sums["neg_triggered"] += trig.any(dim=-1).sum().item()
        sums["triggers"] += trig.sum().item()
    return loss, sums


def contrast_terms(model, batch: list[ContrastGroup], prox_b, pad_id: int, temperature: float,
                   gcpo) -> list[tuple[torch.Tensor, dict]]:
    """GCPO loss of each group of the micro-batch and its stats. The old log-probs are the
    step-start weights, teacher-forced: `prox_b` (per group, one vector per [golden, failures])
    from the pass before the first optimizer step, or this pass's own, detached, when the
    learner step takes a single optimizer step."""
    rows = [r for c in batch for r in c.rows()]
    packed = pack(rows, pad_id).to(model_device(model))
    logp, _ = token_logp(model, packed, temperature)
    old = _proximal(rows, None if prox_b is None else [v for vs in prox_b for v in vs], logp)
    out, at = [], 0
    for c in batch:
        g, f = slice(at, at + 1), slice(at + 1, at + 1 + len(c.failures))
        out.append(gcpo_loss(logp[g], old[g], packed.mask[g], logp[f], old[f], packed.mask[f],
                             gcpo.eps_c, gcpo.form, gcpo.beta_c))
        at += 1 + len(c.failures)
    return out


def contrast_batches(contrasts: list[ContrastGroup], max_seqs: int,
                     max_tokens: int | None = None) -> list[list[int]]:
    """Indices of whole contrast groups per micro-batch, in order, up to `max_seqs` sequences
    and `max_tokens` padded tokens (a group over either limit gets a micro-batch of its own)."""
    batches, current, size, width = [], [], 0, 0
    for j, c in enumerate(contrasts):
        rows = c.rows()
        n, w = len(rows), max(width, max(tokens(r) for r in rows))
        over = size + n > max_seqs or (max_tokens is not None and (size + n) * w > max_tokens)
        if current and over:
            batches.append(current)
            current, size, w = [], 0, max(tokens(r) for r in rows)
        current.append(j)
        size, width = size + n, w
    return batches + ([current] if current else [])


def zero_loss(model, pad_id: int, temperature: float) -> torch.Tensor:
    """A loss of exactly 0 through every parameter: a rank with no rows left still takes part
    in the backward pass (and its gradient reduction) with nothing to add."""
    packed = pack([Row([pad_id], [pad_id], [0.0], 0.0, 0)], pad_id).to(model_device(model))
    logp, _ = token_logp(model, packed, temperature)
    return logp.sum() * 0.0
