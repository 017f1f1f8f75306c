"""Per-token policy losses, their aggregation, and the masks and weights that feed them.

What: the clipped surrogate (§1.3), loss aggregation with step-global denominators (§1.4),
KL and entropy terms (§1.5-1.6), decoupled-PPO behaviour weights (§8.3), the mu-GRPO
negative-advantage veto (§5.2-5.3), the GCPO contrastive loss for all-fail groups (§6.2) and
DAPO's overlong shaping and dynamic-sampling filter (§2), and M2PO's second-moment mask (§8.2c).
Section numbers are docs/ALGORITHMS.md's.
Why: each is a pure function of tensors and explicit scalars, so the trainer composes them with
one `match` and the tests check each against a plain reference. Shapes: B responses, T tokens.

Run the tests with: .venv/bin/python -m pytest tests/test_losses.py
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def ppo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped surrogate per token (§1.3): -min(rho A, clip(rho, 1-clip_low, 1+clip_high) A).

    logp, old_logp: (B, T); adv: (B,) broadcast over tokens. dual_clip=c (> 1) bounds the loss
    of negative-advantage tokens by -c A [R:AREAL `c_clip`]. Returns the loss (B, T) and the
    clip indicators of §1.3, clipped_low = A < 0 and rho < 1 - clip_low, clipped_high = A > 0
    and rho > 1 + clip_high (the clipped branch is active and the gradient is zero), both
    (B, T) bool. Mask and aggregate with `aggregate`; multiply by `behaviour_weights` first
    for decoupled PPO (§8.3).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    ratio = torch.exp(logp - old_logp)  # (B, T)
    a = adv[:, None].to(ratio.dtype)  # (B, 1)
    unclipped = -a * ratio
    clipped = -a * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)  # (B, T); max of negatives = -min
    if dual_clip is not None:
        loss = torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)
    with torch.no_grad():
        clipped_low = (a < 0) & (ratio < 1.0 - clip_low)  # (B, T)
        clipped_high = (a > 0) & (ratio > 1.0 + clip_high)  # (B, T)
    return loss, clipped_low, clipped_high


def _denominator(x: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A scalar denominator of at least 1, so an all-masked mini-batch gives 0, not NaN."""
    return torch.as_tensor(x, dtype=like.dtype, device=like.device).clamp(min=1.0)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    num_seqs: float | torch.Tensor,
    num_tokens: float | torch.Tensor,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values (B, T) under a loss mask (B, T) to a scalar (§1.4).

    num_seqs (responses) and num_tokens (mask sum) are counted over the *whole* optimizer
    mini-batch, across data-parallel ranks and gradient-accumulation micro-batches, so the
    micro-batch results sum to the full-batch value (§1.4 implementation rule):
      "seq-mean-token-mean":     (1/num_seqs) sum_i (sum_t m l / sum_t m_i)   GRPO [R:S4], verl
      "token-mean":              sum m l / num_tokens                          DAPO
      "seq-mean-token-sum-norm": sum m l / (num_seqs * max_len)                Dr. GRPO [R:DRG]
    A sequence with an all-zero mask contributes 0. Masked tokens are selected out with
    `where`, so garbage there (inf, NaN from padding) cannot leak into the sum.
    """
    m = mask.to(values.dtype)  # (B, T)
    masked = torch.where(m != 0, values * m, torch.zeros_like(values))  # (B, T)
    match mode:
        case "token-mean":
            return masked.sum() / _denominator(num_tokens, values)
        case "seq-mean-token-mean":
            seq_len = m.sum(dim=-1).clamp(min=1.0)  # (B,)
            per_seq = masked.sum(dim=-1) / seq_len  # (B,)
            return per_seq.sum() / _denominator(num_seqs, values)
        case "seq-mean-token-sum-norm":
            if max_len is None or max_len <= 0:
                raise ValueError("seq-mean-token-sum-norm needs max_len > 0 (generation cap)")
            return masked.sum() / (_denominator(num_seqs, values) * max_len)
        case _:
            raise ValueError(
                "mode must be 'seq-mean-token-mean', 'token-mean' or 'seq-mean-token-sum-norm', "
                f"got {mode!r}"
            )


def behaviour_weights(
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    cap: float = 2.0,
    mode: str = "truncate",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoupled-PPO behaviour weight w = sg(pi_prox / pi_behav) per token (§8.3).

    mode "truncate" (default, TIS threshold 2.0 [R:SWIFT]): w <- min(w, cap), every token kept.
    mode "mask" (AReaL's behav_imp_weight_cap [R:AREAL]): tokens with w > cap leave the loss;
    their weight is also set to 0. Returns (w (B, T) detached, keep_mask (B, T) bool,
    truncated (B, T) bool = raw w above cap). Log `is/w_mean` as the mean of w over the loss
    tokens and `is/w_truncated_frac` as the fraction of loss tokens with `truncated`.
    """
    with torch.no_grad():
        w = torch.exp(prox_logp.detach() - behav_logp.detach())  # (B, T)
        truncated = w > cap  # (B, T)
        match mode:
            case "truncate":
                return w.clamp(max=cap), torch.ones_like(truncated), truncated
            case "mask":
                return w.masked_fill(truncated, 0.0), ~truncated, truncated
            case _:
                raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate with x = log pi_ref - log pi_theta (§1.5), shape (B, T).

    k1 = -x; k2 = x^2 / 2; k3 = e^x - x - 1 >= 0 (GRPO) [K:DeepSeekMath / Schulman].
    k3 is computed as expm1(x) - x, the same value without cancellation near x = 0.
    """
    x = ref_logp - logp  # (B, T)
    match kind:
        case "k1":
            return -x
        case "k2":
            return 0.5 * x * x
        case "k3":
            return torch.expm1(x) - x
        case _:
            raise ValueError(f"kind must be 'k1', 'k2' or 'k3', got {kind!r}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy over the full vocabulary in fp32 (§1.6): (B, T, V) -> (B, T).

    Tokens with probability 0 (logit -inf, e.g. padded vocab rows) contribute 0 and a finite
    gradient: their log-prob is replaced by 0 before the product.
    """
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    p = logp.exp()
    safe_logp = logp.masked_fill(p == 0, 0.0)
    return -(p * safe_logp).sum(dim=-1)


def veto_mask(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    delta: float = 1e-4,
    scope: str = "suffix",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mu-GRPO negative-advantage veto (§5.2-5.3).

    ratio = pi_theta / pi_behav (B, T), detached by the caller; adv (B,); mask (B, T).
    A trigger is a loss token of a negative-advantage response with ratio < delta; kappa_i is
    the first one. Scopes drop, within responses that have a trigger:
      "suffix" (default, S_kappa): every token after kappa (exclusive; the trigger stays, its
                                    coefficient is already < delta);
      "nontrigger_suffix" (H_kappa): tokens after kappa that are not triggers themselves;
      "sequence" (S_seq):           the whole response.
    Positive-advantage responses are never vetoed [R:MU]. Returns (new_mask, same dtype as mask;
    triggers (B, T) bool; dropped (B, T) bool). `dropped` lists only tokens that were in the
    loss (padding is not counted), so dropped.sum() is the `veto/token_frac` numerator [I].
    """
    in_loss = mask != 0  # (B, T)
    trig = (ratio < delta) & in_loss & (adv[:, None] < 0)  # (B, T)
    has = trig.any(dim=-1, keepdim=True)  # (B, 1)
    t = trig.to(torch.int32)
    after = (t.cumsum(dim=-1) - t) > 0  # (B, T): a trigger lies strictly before t
    match scope:
        case "suffix":
            drop = after
        case "nontrigger_suffix":
            drop = after & ~trig
        case "sequence":
            drop = has.expand_as(trig)
        case _:
            raise ValueError(
                f"scope must be 'suffix', 'nontrigger_suffix' or 'sequence', got {scope!r}"
            )
    dropped = drop & in_loss
    return mask.masked_fill(dropped, 0), trig, dropped


def m2po_keep(
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    tau: float = 0.04,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """M2PO's second-moment mask (Algorithm 1 of arXiv 2510.01161, docs/ALGORITHMS.md 8.2c).

    log_ratio = log pi_theta - log pi_behav (B, T), detached by the caller; adv (B,); mask
    (B, T). The trust-region tokens are the loss tokens where PPO's clip could act: A > 0 and
    r > 1, or A < 0 and r < 1. While the mean of M2 = (log r)^2 over the trust-region tokens
    left is above `tau`, the one with the largest M2 is masked out. Removing the largest value
    never raises the mean, so the tokens kept are the m smallest, m the most whose mean is
    <= tau (found from sorted prefix sums, not token by token). Returns (keep (B, T) bool, False
    on the masked tokens only; trust (B, T) bool, the trust-region tokens; stats: "tokens" and
    "masked" counts, "m2_before" and "m2_after" sums of M2 over the trust-region tokens before
    and after masking, so that sums over micro-batches and ranks divide to means).
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    a = adv[:, None]
    trust = (mask != 0) & (((a > 0) & (log_ratio > 0)) | ((a < 0) & (log_ratio < 0)))  # (B, T)
    m2 = log_ratio.detach().double().square()  # (B, T)
    values = m2[trust]  # (n,)
    order = torch.argsort(values)  # ascending
    prefix = torch.cumsum(values[order], dim=0)  # sum of the m smallest, m = 1..n
    counts = torch.arange(1, len(values) + 1, dtype=prefix.dtype, device=prefix.device)
    kept_n = int((prefix / counts <= tau).sum())  # the means are nondecreasing in m
    kept_sorted = torch.arange(len(values), device=values.device) < kept_n
    kept = torch.empty_like(kept_sorted)
    kept[order] = kept_sorted
    keep = torch.ones_like(trust)
    keep[trust] = kept
    stats = {"tokens": float(len(values)), "masked": float(len(values) - kept_n),
             "m2_before": float(values.sum()), "m2_after": float(values[kept].sum())}
    return keep, trust, stats


def m2po_token_loss(
    logp: torch.Tensor,
    behav_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    tau: float = 0.04,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """M2PO's per-token loss (docs/ALGORITHMS.md 8.2c): -M r A with r = pi_theta / pi_behav, no clip;
    M is `m2po_keep`'s mask from this forward's (detached) ratios. Masked tokens give 0 and no
    gradient but stay in the aggregation's denominators (the paper averages over all tokens, as
    a clipped token stays in PPO's). Returns (loss (B, T), keep (B, T) bool, stats)."""
    log_ratio = logp - behav_logp
    keep, _, stats = m2po_keep(log_ratio.detach(), adv, mask, tau)
    loss = -adv[:, None].to(logp.dtype) * torch.exp(log_ratio)
    return torch.where(keep, loss, torch.zeros_like(loss)), keep, stats


def _as_row(x: torch.Tensor) -> torch.Tensor:
    """(T,) or (1, T) -> (1, T)."""
    return x.reshape(1, -1) if x.dim() == 1 else x


def gcpo_loss(golden_logp: Tensor, golden_old_logp: Tensor, golden_mask: Tensor,
              fail_logp: Tensor, fail_old_logp: Tensor, fail_mask: Tensor, eps_c: float = 0.2,
              form: str = "gated", beta_c: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """GCPO contrastive loss for one all-fail group with a verified golden trajectory (§6.2 [I]).

    golden_*: (T,) or (1, T); fail_*: (n, T). old log-probs are teacher-forced with step-start
    weights. Margin M = mean_t log pi(g_t) - (1/n) sum_i mean_t log pi(y_i,t), length-normalised
    over each mask.
      form "gated": L = -(1/|g|) sum_t 1[rho^g_t < 1+eps_c] log pi(g_t)
                        + (1/n) sum_i (1/|y_i|) sum_t 1[rho^y_it > 1-eps_c] log pi(y_it).
        The ratios enter only the gates (detached), so the gradient is grad log pi, never
        rho grad log pi: old probabilities constrain the update, they do not importance-weight
        it [R:S0]. With all gates open, -grad L = grad M (the first-order margin claim).
      form "logsigmoid": L = -log sigmoid(beta_c M), which saturates once the margin is large.
    Returns (loss scalar, stats) with stats "margin", "gate_closed_frac" (closed gates among all
    masked tokens), "golden_gate_closed_frac" and "fail_gate_closed_frac" as floats.
    """
    g_logp, g_old, g_mask = _as_row(golden_logp), _as_row(golden_old_logp), _as_row(golden_mask)
    g_m = g_mask.to(g_logp.dtype)  # (1, T)
    f_m = fail_mask.to(fail_logp.dtype)  # (n, T)
    g_len = g_m.sum(dim=-1).clamp(min=1.0)  # (1,)
    f_len = f_m.sum(dim=-1).clamp(min=1.0)  # (n,)
    g_sel, f_sel = g_m != 0, f_m != 0
    zero_g, zero_f = torch.zeros_like(g_logp), torch.zeros_like(fail_logp)

    with torch.no_grad():
        g_open = torch.exp(g_logp - g_old) < 1.0 + eps_c  # (1, T): stop raising above 1+eps
        f_open = torch.exp(fail_logp - fail_old_logp) > 1.0 - eps_c  # (n, T): stop lowering
        g_closed = (~g_open & g_sel).sum()
        f_closed = (~f_open & f_sel).sum()
        n_g, n_f = g_sel.sum(), f_sel.sum()

    g_mean = torch.where(g_sel, g_logp, zero_g).sum(dim=-1) / g_len  # (1,)
    f_mean = torch.where(f_sel, fail_logp, zero_f).sum(dim=-1) / f_len  # (n,)
    margin = g_mean.squeeze(0) - f_mean.mean()  # ()

    match form:
        case "gated":
            g_term = torch.where(g_sel & g_open, g_logp, zero_g).sum(dim=-1) / g_len  # (1,)
            f_term = torch.where(f_sel & f_open, fail_logp, zero_f).sum(dim=-1) / f_len  # (n,)
            loss = -g_term.squeeze(0) + f_term.mean()
        case "logsigmoid":
            loss = -F.logsigmoid(beta_c * margin)
        case _:
            raise ValueError(f"form must be 'gated' or 'logsigmoid', got {form!r}")

    stats = {
        "margin": float(margin.detach()),
        "gate_closed_frac": float((g_closed + f_closed) / (n_g + n_f).clamp(min=1)),
        "golden_gate_closed_frac": float(g_closed / n_g.clamp(min=1)),
        "fail_gate_closed_frac": float(f_closed / n_f.clamp(min=1)),
    }
    return loss, stats


def dapo_overlong_penalty(length: int, max_len: int, cache_len: int, phi: float = 1.0) -> float:
    """DAPO soft overlong punishment added to the correctness reward (§2) [R:DAPO].

    0 up to max_len - cache_len, then linear down to -phi at max_len, and -phi beyond.
    Equals AReaL's min(-(length - (max_len - cache_len)) / cache_len * phi, 0) up to max_len.
    """
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got {cache_len}, {max_len}")
    free = max_len - cache_len
    if length <= free:
        return 0.0
    if length <= max_len:
        return phi * (free - length) / cache_len
    return -phi


def dapo_keep_group(acc: Sequence[bool] | Sequence[float] | torch.Tensor) -> bool:
    """DAPO dynamic sampling (§2): keep a group only if 0 < sum(acc) < n (it has signal)."""
    values = acc.tolist() if isinstance(acc, torch.Tensor) else list(acc)
    c = sum(bool(x) for x in values)
    return 0 < c < len(values)
