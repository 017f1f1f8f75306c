"""One optimizer step of the policy on a step's training rows (ALGORITHMS.md 1.3-1.7, 5, 6, 8.3).

The ratio's denominator is chosen by `loss.old_policy`:
  proximal  (decoupled PPO, 8.3): the step has one update per batch, so the proximal policy
            (the learner's weights at the start of the step) is exactly the policy of the
            forward pass: its log-probs are that pass's, detached, and no separate recompute is
            needed. u = pi_theta / pi_prox is 1 in value, and w = sg(pi_prox / pi_behav)
            corrects for the actor's (possibly stale) sampling weights, truncated at
            `behav_weight_cap`. A row whose stored log-probs are no valid correction (AR3PO
            policy-recomputed reuse) gets w = 1.
  behaviour (Mu-GRPO, 5.2): the stored behaviour log-probs are the denominator, so the ratio
            drifts through a stage of many steps on the same data, and w = 1.
With `mugrpo.veto_scope` on, the negative-advantage veto (5.2) masks tokens from triggers of
pi_theta / pi_behav (recomputed, detached, at every update); under token-mean aggregation a
no-grad pass first counts the vetoed tokens so the step-global denominator excludes them (1.4).
GCPO groups (6.2) add micro-batches of [golden, failures...] to the same accumulated step.

Rows with zero advantage add exactly nothing to the policy-gradient loss, so when neither KL nor
entropy terms are on they are only counted in the denominators, never run forward.

Data-parallel learner ranks (learner/ranks.py): every rank gets the whole batch and runs its
share (every R-th row by length, every R-th contrast group); the denominators stay the
step-global ones, each rank's loss is scaled by R because DeepSpeed averages gradients across
ranks, and ranks with fewer micro-batches run zero-loss passes so that all take the same number
of backward passes (ZeRO may communicate in each). The metric sums are added across ranks.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

from learner.batch import Row, micro_batches, pack
from learner.losses import (aggregate, behaviour_weights, entropy_from_logits, gcpo_loss,
                            ppo_token_loss, veto_mask)
from protocol.algorithm_config import GCPOConfig, MuGRPOConfig
from protocol.config import LossConfig


@dataclass(frozen=True)
class LossRow(Row):
    behav_weight: bool = True
    """False when the stored behaviour log-probs are no valid correction for this row (AR3PO
    policy-recomputed reuse): w = 1 and its ratio is taken to the proximal policy (8.4)."""


@dataclass(frozen=True)
class ContrastGroup:
    """An all-fail group with a verified golden trajectory, for the GCPO term (6.2)."""

    prompt: list[int]
    golden: list[int]  # golden response token ids (eos included)
    failures: list[list[int]]  # the group's fresh failed responses


def token_logp(model, packed) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of every target token (B, T-1) and the logits it came from (B, T-1, V)."""
    logits = model(input_ids=packed.input_ids, attention_mask=packed.attention).logits[:, :-1]
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, packed.targets[..., None])[..., 0]
    return logp, logits


def grad_norm_of(module) -> float:
    """Total gradient norm before clipping (DeepSpeed clips inside `step`)."""
    grads = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def ratio_terms(prox: torch.Tensor, behav: torch.Tensor, corrected: torch.Tensor,
                loss_cfg: LossConfig) -> tuple[torch.Tensor, ...]:
    """(old_logp, w, keep, truncated), all (B, T): the ratio's denominator and the behaviour
    weight per token. prox, behav: (B, T) detached; corrected: (B, 1) bool, False for rows whose
    behaviour log-probs must not correct (w = 1, ratio to prox)."""
    ones = torch.ones_like(prox)
    match loss_cfg.old_policy:
        case "behaviour":
            old = torch.where(corrected, behav, prox)
            return old, ones, ones.bool(), torch.zeros_like(ones, dtype=torch.bool)
        case "proximal":
            if loss_cfg.behav_weight_mode == "off":
                return prox, ones, ones.bool(), torch.zeros_like(ones, dtype=torch.bool)
            w, keep, truncated = behaviour_weights(prox, behav, loss_cfg.behav_weight_cap,
                                                   loss_cfg.behav_weight_mode)
            return (prox, torch.where(corrected, w, ones), keep | ~corrected,
                    truncated & corrected)


def _loss_masks(logp, packed, rows_k, loss_cfg, veto):
    """Ratio terms and the loss mask of one micro-batch, veto applied; plus the veto tensors."""
    prox = logp.detach()
    corrected = torch.tensor([getattr(r, "behav_weight", True) for r in rows_k],
                             device=packed.mask.device)[:, None]  # (B, 1)
    old, w, keep, truncated = ratio_terms(prox, packed.behav_logp, corrected, loss_cfg)
    mask = packed.mask * keep.to(packed.mask.dtype)
    trig = dropped = None
    if veto is not None:  # triggers on pi_theta / pi_behav, the data-generating policy (8.4)
        ratio = torch.exp(prox - packed.behav_logp)
        mask, trig, dropped = veto_mask(ratio, packed.adv, mask, veto.veto_delta,
                                        veto.veto_scope)
    return old, w, truncated, mask, trig, dropped


@torch.no_grad()
def vetoed_tokens(model, batches, pad_id, loss_cfg, veto) -> int:
    """Loss tokens the veto will drop in this step's micro-batches (same weights, same masks)."""
    total = 0
    for rows_k in batches:
        packed = pack(rows_k, pad_id)
        logp, _ = token_logp(model, packed)
        total += int(_loss_masks(logp, packed, rows_k, loss_cfg, veto)[5].sum())
    return total


def contrast_batches(contrasts: list[ContrastGroup], micro_batch: int) -> list[list]:
    """Whole contrast groups per micro-batch, up to `micro_batch` sequences (at least one group)."""
    batches, current, size = [], [], 0
    for c in contrasts:
        rows = 1 + len(c.failures)
        if current and size + rows > micro_batch:
            batches.append(current)
            current, size = [], 0
        current.append(c)
        size += rows
    return batches + ([current] if current else [])


def _contrast_terms(model, batch: list[ContrastGroup], pad_id: int, gcpo: GCPOConfig):
    """GCPO loss of each group of the micro-batch and its stats. The old log-probs are the
    step-start weights, teacher-forced: this pass's, detached (one update per step)."""
    rows = [Row(c.prompt, resp, [0.0] * len(resp), 0.0, 0)
            for c in batch for resp in (c.golden, *c.failures)]
    packed = pack(rows, pad_id)
    logp, _ = token_logp(model, packed)
    old = logp.detach()
    out, at = [], 0
    for c in batch:
        g, f = slice(at, at + 1), slice(at + 1, at + 1 + len(c.failures))
        out.append(gcpo_loss(logp[g], old[g], packed.mask[g], logp[f], old[f], packed.mask[f],
                             gcpo.eps_c, gcpo.form, gcpo.beta_c))
        at += 1 + len(c.failures)
    return out


def policy_update(engine, rows: list[Row], loss_cfg: LossConfig, pad_id: int,
                  micro_batch: int, max_new_tokens: int, veto: MuGRPOConfig | None = None,
                  contrasts: list[ContrastGroup] = (), gcpo: GCPOConfig | None = None) -> dict:
    """Forward, backward and step on `rows` (and GCPO's `contrasts`); returns loss metrics."""
    veto = veto if veto is not None and veto.veto_scope != "off" else None
    num_seqs = len(rows)
    num_tokens = sum(len(r.response) for r in rows)
    needs_all = loss_cfg.kl_beta > 0 or loss_cfg.entropy_coef > 0
    active = [r for r in rows if needs_all or r.adv != 0.0]
    t0 = time.time()
    engine.train()
    rank, world = rank_and_world()
    mine = sorted(active, key=lambda r: len(r.prompt) + len(r.response))[rank::world]
    pg_batches = micro_batches(mine, micro_batch)
    if veto is not None and loss_cfg.aggregation == "token-mean":
        num_tokens -= int(_sum_over_ranks([vetoed_tokens(engine, pg_batches, pad_id, loss_cfg,
                                                         veto)])[0])
    gc_batches = contrast_batches(list(contrasts)[rank::world], micro_batch) \
        if gcpo and contrasts else []
    jobs = [("pg", b) for b in pg_batches] + [("gcpo", b) for b in gc_batches]
    passes = _max_over_ranks(len(jobs))
    jobs += [("idle", None)] * (passes - len(jobs))
    sums: Counter = Counter()
    grad_norm = None
    for k, (kind, batch) in enumerate(jobs):
        match kind:
            case "pg":
                loss = _pg_loss(engine, batch, loss_cfg, veto, pad_id, num_seqs, num_tokens,
                                max_new_tokens, sums)
            case "gcpo":
                terms = _contrast_terms(engine, batch, pad_id, gcpo)
                loss = gcpo.coef * sum(t for t, _ in terms) / len(contrasts)
                for _, stats in terms:
                    sums["gc_margin"] += stats["margin"]
                    sums["gc_closed"] += stats["gate_closed_frac"]
                sums["gc_loss"] += loss.item()
            case "idle":
                loss = _zero_loss(engine, pad_id)
        last = k == len(jobs) - 1
        engine.set_gradient_accumulation_boundary(last)
        engine.backward(loss * world)  # DeepSpeed averages over ranks; the loss is their sum
        if last:
            grad_norm = grad_norm_of(engine.module)
        engine.step()
    # With no row carrying gradient (every group all-correct or all-wrong) there is nothing to
    # step: the weights stay as they are, and the caller still counts the step.
    compute_s = time.time() - t0
    sums = Counter(dict(zip(_SUM_KEYS, _sum_over_ranks([sums[k] for k in _SUM_KEYS]))))

    def per_token(total: float) -> float | None:  # null, not 0, when no token was in the loss
        return total / sums["tokens"] if sums["tokens"] else None

    metrics = {
        "loss": sums["loss"] + sums["gc_loss"],
        "pg/clip_frac": per_token(sums["clip_low"] + sums["clip_high"]),
        "pg/clip_frac_low": per_token(sums["clip_low"]),
        "pg/clip_frac_high": per_token(sums["clip_high"]),
        "is/w_mean": per_token(sums["w"]),
        "is/w_truncated_frac": per_token(sums["w_trunc"]),
        "policy/entropy": per_token(sums["entropy"]),
        "train/rows_forward": len(active),
        "grad_norm": grad_norm,
        "perf/train_tokens_per_s": sums["train_tokens"] / max(compute_s, 1e-9),
        "timing/update": compute_s,
    }
    if veto is not None:
        metrics.update({
            "veto/token_frac": sums["vetoed"] / max(sums["neg_tokens"], 1.0),
            "veto/token_frac_all": per_token(sums["vetoed"]),
            "veto/resp_frac": sums["neg_triggered"] / max(sums["neg_rows"], 1.0),
            "veto/triggers": int(sums["triggers"]),
        })
    if gcpo and contrasts:
        after = [s["margin"] for b in gc_batches
                 for _, s in torch.no_grad()(_contrast_terms)(engine.module, b, pad_id, gcpo)]
        after_sum, after_n = _sum_over_ranks([sum(after), len(after)])
        metrics.update({
            "gcpo/loss": sums["gc_loss"],
            "gcpo/margin": sums["gc_margin"] / len(contrasts),
            "gcpo/margin_after": after_sum / after_n,
            "gcpo/gate_closed_frac": sums["gc_closed"] / len(contrasts),
        })
    return metrics


_SUM_KEYS = ("loss", "clip_low", "clip_high", "w", "w_trunc", "entropy", "tokens", "train_tokens",
             "vetoed", "neg_tokens", "neg_rows", "neg_triggered", "triggers", "gc_loss",
             "gc_margin", "gc_closed")


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the learner ranks; (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device() -> torch.device:
    """Where tensors for the learners' default group must live (NCCL needs CUDA)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sum_over_ranks(values: list[float]) -> list[float]:
    if rank_and_world()[1] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return t.tolist()


def _max_over_ranks(value: int) -> int:
    if rank_and_world()[1] == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _zero_loss(engine, pad_id: int) -> torch.Tensor:
    """A loss of exactly 0 through every parameter: a rank with no rows left still takes part
    in the backward pass (and its gradient reduction) with nothing to add."""
    packed = pack([Row([pad_id], [pad_id], [0.0], 0.0, 0)], pad_id)
    logp, _ = token_logp(engine, packed)
    return logp.sum() * 0.0


def _pg_loss(engine, rows_k, loss_cfg, veto, pad_id, num_seqs, num_tokens, max_new_tokens,
             sums) -> torch.Tensor:
    """The policy-gradient loss of one micro-batch (its share of the step-global mean)."""
    packed = pack(rows_k, pad_id)
    logp, logits = token_logp(engine, packed)
    old, w, truncated, mask, trig, dropped = _loss_masks(logp, packed, rows_k, loss_cfg, veto)
    loss_tok, c_low, c_high = ppo_token_loss(logp, old, packed.adv, loss_cfg.clip_low,
                                             loss_cfg.clip_high, loss_cfg.dual_clip)
    loss_tok = loss_tok * w * packed.scale[:, None]
    loss = aggregate(loss_tok, mask, loss_cfg.aggregation, num_seqs, num_tokens, max_new_tokens)
    entropy = entropy_from_logits(logits.detach() if loss_cfg.entropy_coef == 0 else logits)
    if loss_cfg.entropy_coef > 0:
        loss = loss - loss_cfg.entropy_coef * aggregate(
            entropy, mask, loss_cfg.aggregation, num_seqs, num_tokens, max_new_tokens)
    m = packed.mask
    sums["loss"] += loss.item()
    sums["clip_low"] += (c_low * m).sum().item()
    sums["clip_high"] += (c_high * m).sum().item()
    sums["w"] += (w * m).sum().item()
    sums["w_trunc"] += (truncated * m).sum().item()
    sums["entropy"] += (entropy.detach() * m).sum().item()
    sums["tokens"] += m.sum().item()
    sums["train_tokens"] += int(packed.attention.sum().item())
    if veto is not None:
        neg = (packed.adv < 0)[:, None] & (m != 0)  # (B, T) loss tokens of negative responses
        sums["vetoed"] += dropped.sum().item()
        sums["neg_tokens"] += neg.sum().item()
        sums["neg_rows"] += neg.any(dim=-1).sum().item()
        sums["neg_triggered"] += trig.any(dim=-1).sum().item()
        sums["triggers"] += trig.sum().item()
    return loss
