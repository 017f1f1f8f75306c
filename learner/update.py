"""One optimizer step of the policy on a step's training rows (decoupled PPO, ALGORITHMS.md 8.3).

The step has one update per batch, so the proximal policy (the learner's weights at the start of
the step) is exactly the policy of the forward pass: its log-probs are that pass's, detached, and
no separate recompute pass is needed. The ratio u = pi_theta / pi_prox is therefore 1 in value and
the gradient is w * A * grad log pi, where w = sg(pi_prox / pi_behav) corrects for the actor's
(possibly stale) sampling weights, truncated at `behav_weight_cap`.

Rows with zero advantage add exactly nothing to the policy-gradient loss, so when neither KL nor
entropy terms are on they are only counted in the denominators, never run forward.
"""

from __future__ import annotations

import time

import torch

from learner.batch import Row, micro_batches, pack
from learner.losses import aggregate, behaviour_weights, entropy_from_logits, ppo_token_loss
from protocol.config import LossConfig


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


def policy_update(engine, rows: list[Row], loss_cfg: LossConfig, pad_id: int,
                  micro_batch: int, max_new_tokens: int) -> dict:
    """Forward, backward and step on `rows`; returns the step's loss metrics."""
    num_seqs = len(rows)
    num_tokens = sum(len(r.response) for r in rows)
    needs_all = loss_cfg.kl_beta > 0 or loss_cfg.entropy_coef > 0
    active = [r for r in rows if needs_all or r.adv != 0.0]
    sums = dict(loss=0.0, clip_low=0.0, clip_high=0.0, w=0.0, w_trunc=0.0, entropy=0.0, tokens=0.0,
                train_tokens=0)
    t0 = time.time()
    grad_norm = None
    batches = micro_batches(active, micro_batch)
    engine.train()
    for k, rows_k in enumerate(batches):
        packed = pack(rows_k, pad_id)
        logp, logits = token_logp(engine, packed)
        prox = logp.detach()
        if loss_cfg.behav_weight_mode == "off":
            w, keep = torch.ones_like(prox), torch.ones_like(prox, dtype=torch.bool)
            truncated = torch.zeros_like(keep)
        else:
            w, keep, truncated = behaviour_weights(prox, packed.behav_logp, loss_cfg.behav_weight_cap,
                                                   loss_cfg.behav_weight_mode)
        mask = packed.mask * keep.to(packed.mask.dtype)
        loss_tok, c_low, c_high = ppo_token_loss(logp, prox, packed.adv, loss_cfg.clip_low,
                                                 loss_cfg.clip_high, loss_cfg.dual_clip)
        loss_tok = loss_tok * w * packed.scale[:, None]
        loss = aggregate(loss_tok, mask, loss_cfg.aggregation, num_seqs, num_tokens, max_new_tokens)
        entropy = entropy_from_logits(logits.detach() if loss_cfg.entropy_coef == 0 else logits)
        if loss_cfg.entropy_coef > 0:
            loss = loss - loss_cfg.entropy_coef * aggregate(
                entropy, mask, loss_cfg.aggregation, num_seqs, num_tokens, max_new_tokens)
        last = k == len(batches) - 1
        engine.set_gradient_accumulation_boundary(last)
        engine.backward(loss)
        if last:
            grad_norm = grad_norm_of(engine.module)
        engine.step()
        m = packed.mask
        sums["loss"] += loss.item()
        sums["clip_low"] += (c_low * m).sum().item()
        sums["clip_high"] += (c_high * m).sum().item()
        sums["w"] += (w * m).sum().item()
        sums["w_trunc"] += (truncated * m).sum().item()
        sums["entropy"] += (entropy.detach() * m).sum().item()
        sums["tokens"] += m.sum().item()
        sums["train_tokens"] += int(packed.attention.sum().item())
    # With no row carrying gradient (every group all-correct or all-wrong) there is nothing to
    # step: the weights stay as they are, and the caller still counts the step.
    compute_s = time.time() - t0
    tok = max(sums["tokens"], 1.0)
    return {
        "loss": sums["loss"],
        "pg/clip_frac": (sums["clip_low"] + sums["clip_high"]) / tok,
        "pg/clip_frac_low": sums["clip_low"] / tok,
        "pg/clip_frac_high": sums["clip_high"] / tok,
        "is/w_mean": sums["w"] / tok,
        "is/w_truncated_frac": sums["w_trunc"] / tok,
        "policy/entropy": sums["entropy"] / tok,
        "train/rows_forward": len(active),
        "grad_norm": grad_norm,
        "perf/train_tokens_per_s": sums["train_tokens"] / max(compute_s, 1e-9),
        "timing/update": compute_s,
    }
