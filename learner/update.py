"""One learner step's update of the policy: its optimizer steps on the step's rows (docs/ALGORITHMS.md
1.3-1.7, 5, 6, 8.3).

The step's batch is split into `optim.mini_batches` mini-batches of whole groups, and every pass
of `optim.epochs` takes one optimizer step per mini-batch, in the same order (as verl's PPO
epochs). Before the first one, a no-grad pass computes the proximal log-probs pi_prox with the
step-start weights (8.3) for every row (and GCPO's teacher-forced old log-probs, 6.2), and, with
`loss.kl_beta` > 0, one pass of the frozen reference model gives pi_ref (1.5). So from the second
optimizer step on, u = pi_theta / pi_prox moves away from 1, the clip terms (and GCPO's gates)
act, and w = sg(pi_prox / pi_behav) stays the step-start correction. With a single optimizer step
the proximal policy is exactly that step's forward: its log-probs, detached, are used and the
extra pass is skipped (the same values, one forward less).
The policy version counts learner steps, not optimizer steps (as AReaL's): staleness is in
learner steps whatever `mini_batches` and `epochs` are.

Each optimizer step's loss uses its mini-batch's global denominators (1.4): the rows of the
mini-batch and their loss tokens, counted over every rank and micro-batch; tokens that the IS-cap
mask or the Mu-GRPO veto drop are left out of the token-mean denominator (a no-grad pass counts
them first when they depend on the current weights). Rows with zero advantage add nothing to the
policy-gradient loss, so when neither KL nor entropy terms are on they are counted in the
denominators but never run forward. The token metrics (`pg/clip_frac*`, `is/w_*`,
`policy/entropy`) have one denominator on every preset: the response tokens of the rows with a
nonzero advantage, whether or not KL or entropy make the others run forward; `kl/mean` is over
the tokens the KL term acts on (every row's loss tokens). Micro-batches are bounded by `learner.micro_batch` sequences
and `learner.max_tokens_per_micro_batch` padded tokens; log-probs are computed in chunks
(learner/logprobs.py).

Data-parallel learner ranks (learner/ranks.py): every rank gets the whole batch and runs its
share of each mini-batch (every R-th row by length, every R-th contrast group); each rank's loss
is scaled by R because DeepSpeed averages gradients across ranks, and ranks with fewer
micro-batches run zero-loss passes so that all take the same number of backward passes per
optimizer step (ZeRO may communicate in each). The metric sums are added across ranks; the token
ratios (clip, w, entropy, KL) are over every optimizer step of the learner step.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

from learner.batch import (Row, micro_batches, mini_batches, of_responses, on_responses, pack,
                           tokens)
from learner.engine import learning_rate, set_learning_rate
from learner.logprobs import model_device, token_logp
from learner.lora import reference_off
from learner.losses import gcpo_loss
from learner.micro_loss import (ContrastGroup, Denominators, LossRow, contrast_batches,  # noqa: F401
                                contrast_terms, dropped_tokens, pg_loss, ratio_terms, zero_loss)
from learner.update_spec import UpdateSpec


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step's work on this rank."""

    num_seqs: int  # rows of the mini-batch over every rank, zero-advantage ones included
    num_tokens: int  # their response tokens
    num_contrasts: int  # its GCPO groups over every rank
    pg: list[list[int]]  # this rank's micro-batches of row indices
    gc: list[list[int]]  # this rank's micro-batches of contrast indices
    passes: int  # backward passes every rank takes: the most any rank has


def plan(rows: list[Row], contrasts: list[ContrastGroup], spec: UpdateSpec, rank: int,
         world: int, order_seed: str | None = None) -> list[MiniBatch]:
    """The mini-batches of one pass over a learner step's batch and this rank's micro-batches in
    each. Every rank plans every rank's share (all hold the whole batch), so none needs to ask
    the others."""
    needs_all = spec.loss.kl_beta > 0 or spec.loss.entropy_coef > 0
    row_sets = mini_batches([r.group_id for r in rows], spec.mini_batches, order_seed)
    gc_sets = mini_batches([""] * len(contrasts), spec.mini_batches, order_seed)
    out = []
    for row_set, gc_set in zip(row_sets, gc_sets):
        active = sorted((i for i in row_set if needs_all or rows[i].adv != 0.0),
                        key=lambda i: tokens(rows[i]))
        pg = [micro_batches(active[r::world], lambda i: tokens(rows[i]), spec.micro_batch,
                            spec.max_tokens) for r in range(world)]
        gc = [[[gc_set[r::world][k] for k in b]
               for b in contrast_batches([contrasts[j] for j in gc_set[r::world]],
                                         spec.micro_batch, spec.max_tokens)]
              for r in range(world)]
        out.append(MiniBatch(len(row_set), sum(len(rows[i].response) for i in row_set),
                             len(gc_set), pg[rank], gc[rank],
                             max(len(pg[r]) + len(gc[r]) for r in range(world))))
    return out


def needs_proximal_pass(rows: list[Row], contrasts: list, spec: UpdateSpec) -> bool:
    """Whether the step-start log-probs must be computed before the first optimizer step: with
    several optimizer steps, for rows ratioed to pi_prox and for GCPO's old log-probs; with one,
    only for the IS-cap mask's token-mean denominator (the forward's own come too late)."""
    lc = spec.loss
    uses_prox = contrasts or any(
        getattr(r, "reuse", "") == "policy_recomputed"
        or (lc.old_policy == "proximal" and getattr(r, "reuse", "") == "") for r in rows)
    if spec.optimizer_steps > 1:
        return bool(uses_prox)
    return (lc.old_policy == "proximal" and lc.behav_weight_mode == "mask"
            and lc.aggregation == "token-mean")


@torch.no_grad()
def logp_pass(model, rows: list[Row], indices: list[int], spec: UpdateSpec,
              pad_id: int) -> dict[int, torch.Tensor]:
    """Row index -> log-probs (n_i,) of its response tokens under `model`, no gradient."""
    out = {}
    for batch in micro_batches(indices, lambda i: tokens(rows[i]), spec.micro_batch,
                               spec.max_tokens):
        rows_k = [rows[i] for i in batch]
        packed = pack(rows_k, pad_id).to(model_device(model))
        logp, _ = token_logp(model, packed, spec.temperature)
        out.update(zip(batch, of_responses(rows_k, logp)))
    return out


def policy_update(engine, rows: list[Row], spec: UpdateSpec, pad_id: int,
                  contrasts: list[ContrastGroup] = (), reference=None, step: int = 0) -> dict:
    """Learner step `step`'s optimizer steps on `rows` (and GCPO's `contrasts`); returns metrics.
    reference: the frozen reference model for the KL term (loss.kl_beta > 0), else None."""
    if spec.loss.kl_beta > 0 and reference is None:
        raise ValueError("loss.kl_beta > 0 needs the reference model (learner.engine."
                         "build_reference)")
    contrasts = list(contrasts) if spec.gcpo is not None else []
    rank, world = rank_and_world()
    lr = learning_rate(spec.lr, spec.warmup_steps, step)
    set_learning_rate(engine, lr)
    t0 = time.time()
    engine.train()
    passes = [plan(rows, contrasts, spec, rank, world, spec.group_order(step, e))
              for e in range(spec.epochs)]
    mine = sorted({i for steps in passes for s in steps for b in s.pg for i in b})
    mine_gc = sorted({j for steps in passes for s in steps for b in s.gc for j in b})
    sums: Counter = Counter()
    timing = {}
    prox = ref = prox_gc = None
    if needs_proximal_pass(rows, contrasts, spec):
        t = time.time()
        prox = logp_pass(engine, rows, mine, spec, pad_id)
        if contrasts:
            # a contrast may fall to other ranks in later passes: its margin counts once, on
            # the rank that has it in the first pass
            first = {j for s in passes[0] for b in s.gc for j in b}
            prox_gc, margins = _contrast_start(engine, contrasts, mine_gc, first, spec, pad_id)
            for margin in margins:
                sums["gc_margin_start"] += margin
        timing["timing/old_logp"] = time.time() - t
    if reference is not None:
        t = time.time()
        with reference_off(reference):
            ref = logp_pass(reference, rows, mine, spec, pad_id)
        timing["timing/ref"] = time.time() - t
    norms, per_step = [], []  # per optimizer step: (clipped, loss tokens) on this rank
    for steps in passes:
        for s in steps:
            before = (sums["clip_low"] + sums["clip_high"], sums["tokens"])
            if s.passes:  # a mini-batch with no row carrying gradient on any rank: no step
                norm, stats = _optimizer_step(engine, s, rows, contrasts, prox, ref, prox_gc,
                                              spec, pad_id, world)
                norms.append(norm)
                for stat in stats:  # in the order the micro-batches ran
                    sums.update(stat)
            per_step += [sums["clip_low"] + sums["clip_high"] - before[0],
                         sums["tokens"] - before[1]]
    compute_s = time.time() - t0
    reduced = _sum_over_ranks([sums[k] for k in _SUM_KEYS] + per_step)
    sums = Counter(dict(zip(_SUM_KEYS, reduced)))
    metrics = _metrics(sums, norms, len([i for s in passes[0] for b in s.pg for i in b]), rows,
                       contrasts, engine, spec, pad_id, compute_s, timing)
    metrics["optim/lr"] = lr
    # forward/backward passes this rank ran (learner.micro_batch, max_tokens_per_micro_batch)
    metrics["train/micro_batches"] = sum(s.passes for steps in passes for s in steps)
    metrics.update(optimizer_step_staleness(rows, spec, step, passes))
    if spec.mini_batches > 1:  # by optimizer step, pass after pass: where the clip acts
        metrics.update(_by_optimizer_step(reduced[len(_SUM_KEYS):], passes))
    return metrics


def _by_optimizer_step(per_step: list[float], passes: list[list[MiniBatch]]) -> dict:
    """mb/*: per optimizer step, the clipped share of its loss tokens (`per_step` holds the
    clipped and loss tokens of each, summed over ranks) and its mean row length."""
    clipped, toks = per_step[::2], per_step[1::2]
    return {"mb/clip_frac": [c / t if t else None for c, t in zip(clipped, toks)],
            "mb/len_mean": [s.num_tokens / s.num_seqs if s.num_seqs else None
                            for steps in passes for s in steps]}


def optimizer_step_staleness(rows: list[Row], spec: UpdateSpec, step: int,
                             passes: list[list[MiniBatch]]) -> dict:
    """Staleness in optimizer steps (policy versions count learner steps): a row sampled by
    version v and trained in learner step `step` is (step - v) x optimizer_steps (at most: an
    earlier learner step whose mini-batches carried no gradient took fewer) plus the optimizer
    steps this learner step took before the row's own behind the weights it updates. Over the
    fresh rows that carry gradient (reused responses are exempt, as from stale/*)."""
    behind, taken = [], 0
    for e, steps in enumerate(passes):
        sets = mini_batches([r.group_id for r in rows], spec.mini_batches,
                            spec.group_order(step, e))
        for row_set, s in zip(sets, steps):
            behind += [(step - rows[i].policy_version) * spec.optimizer_steps + taken
                       for i in row_set
                       if rows[i].adv != 0 and not getattr(rows[i], "reuse", "")]
            taken += s.passes > 0
    if not behind:
        return {}
    return {"stale/optimizer_steps_max": max(behind),
            "stale/optimizer_steps_mean": sum(behind) / len(behind)}


def _contrast_start(engine, contrasts, mine_gc, counted, spec, pad_id
                    ) -> tuple[dict[int, list], list[float]]:
    """Contrast index -> teacher-forced step-start log-probs of [golden, failures...] for the
    contrasts `mine_gc`, and the margins (GCPO's `margin` before the step) of those in
    `counted`."""
    out, margins = {}, []
    for j in mine_gc:
        rows = contrasts[j].rows()
        got = logp_pass(engine, rows, list(range(len(rows))), spec, pad_id)
        out[j] = [got[k] for k in range(len(rows))]
        packed = pack(rows, pad_id)
        old = on_responses(rows, out[j], packed.mask.shape[1])
        _, stats = gcpo_loss(old[:1], old[:1], packed.mask[:1], old[1:], old[1:],
                             packed.mask[1:], spec.gcpo.eps_c, spec.gcpo.form, spec.gcpo.beta_c)
        if j in counted:
            margins.append(stats["margin"])
    return out, margins


def _optimizer_step(engine, s: MiniBatch, rows, contrasts, prox, ref, prox_gc,
                    spec: UpdateSpec, pad_id: int, world: int
                    ) -> tuple[float | None, list[Counter]]:
    """Forward/backward every micro-batch of mini-batch `s`, then step; returns the gradient
    norm before clipping and the loss terms' metric sums, in the order they ran."""
    stats: list[Counter] = []
    num_tokens = s.num_tokens
    lc = spec.loss
    if lc.aggregation == "token-mean" and (spec.veto is not None or prox is not None
                                           and lc.behav_weight_mode == "mask"):
        num_tokens -= int(_sum_over_ranks([sum(
            dropped_tokens(engine, [rows[i] for i in b], _take(prox, b), spec, pad_id)
            for b in s.pg)])[0])
    den = Denominators(s.num_seqs, num_tokens)
    jobs = [("pg", b) for b in s.pg] + [("gcpo", b) for b in s.gc]
    jobs += [("idle", None)] * (s.passes - len(jobs))
    grad_norm = None
    # ZeRO partitions (or bf16 moves) the gradients away from p.grad: the optimizer computes the
    # global norm in its step; an fp32 stage-0 engine leaves whole reduced gradients in p.grad
    own_norm = engine.zero_optimization_stage() == 0 and not engine.bfloat16_enabled()
    for k, (kind, batch) in enumerate(jobs):
        match kind:
            case "pg":
                loss, pg_stats = pg_loss(engine, [rows[i] for i in batch], _take(prox, batch),
                                         _take(ref, batch), spec, pad_id, den)
                stats.append(pg_stats)
            case "gcpo":
                terms = contrast_terms(engine, [contrasts[j] for j in batch],
                                       _take(prox_gc, batch), pad_id, spec.temperature,
                                       spec.gcpo)
                loss = spec.gcpo.coef * sum(t for t, _ in terms) / s.num_contrasts
                stats += [Counter(gc_margin=term["margin"], gc_closed=term["gate_closed_frac"],
                                  gc_seen=1) for _, term in terms]
                stats.append(Counter(gc_loss=loss.item()))
            case "idle":
                loss = zero_loss(engine, pad_id, spec.temperature)
        last = k == len(jobs) - 1
        engine.set_gradient_accumulation_boundary(last)
        engine.backward(loss * world)  # DeepSpeed averages over ranks; the loss is their sum
        if last and own_norm:
            grad_norm = grad_norm_of(engine.module)
        engine.step()
        if last and not own_norm:
            norm = engine.get_global_grad_norm()
            grad_norm = None if norm is None else float(norm)
    return grad_norm, stats


def _take(values: dict | None, indices: list[int]) -> list | None:
    return None if values is None else [values[i] for i in indices]


def _metrics(sums, norms, rows_forward, rows, contrasts, engine, spec, pad_id, compute_s,
             timing) -> dict:
    n_steps = len(norms)  # every rank takes the same optimizer steps
    known = [n for n in norms if n is not None]  # None: the engine computed no norm

    def per_token(total: float) -> float | None:  # null, not 0, when no token was in the loss
        return total / sums["tokens"] if sums["tokens"] else None

    metrics = {
        "loss": (sums["loss"] + sums["gc_loss"]) / max(n_steps, 1),
        "pg/clip_frac": per_token(sums["clip_low"] + sums["clip_high"]),
        "pg/clip_frac_low": per_token(sums["clip_low"]),
        "pg/clip_frac_high": per_token(sums["clip_high"]),
        "is/w_mean": per_token(sums["w"]),
        # the mean weight stays near 1 however stale the data (E over the behaviour policy of
        # pi/mu is 1); how far the behaviour policy is from the proximal one shows in |w - 1|
        "is/w_absdev": per_token(sums["w_absdev"]),
        "is/w_truncated_frac": per_token(sums["w_trunc"]),
        "policy/entropy": per_token(sums["entropy"]),
        "train/rows_forward": int(_sum_over_ranks([rows_forward])[0]),
        "train/optimizer_steps": n_steps,
        "grad_norm": sum(known) / len(known) if known else None,
        "perf/train_tokens_per_s": sums["train_tokens"] / max(compute_s, 1e-9),
        "timing/update": compute_s,
        **timing,
    }
    if spec.loss.kl_beta > 0:  # every row runs forward: over the KL term's loss tokens
        metrics["kl/mean"] = sums["kl"] / sums["kl_tokens"] if sums["kl_tokens"] else None
    if spec.veto is not None:
        metrics.update({
            "veto/token_frac": sums["vetoed"] / max(sums["neg_tokens"], 1.0),
            "veto/token_frac_all": per_token(sums["vetoed"]),
            "veto/resp_frac": sums["neg_triggered"] / max(sums["neg_rows"], 1.0),
            "veto/triggers": int(sums["triggers"]),
        })
    if spec.loss.trust_region == "m2po":  # 8.2c: M2 means over the trust-region tokens
        trust = sums["m2po_tokens"]
        metrics.update({
            "m2po/masked_frac": per_token(sums["m2po_masked"]),
            "m2po/trust_frac": per_token(trust),
            "m2po/m2_before": sums["m2po_m2_before"] / trust if trust else None,
            "m2po/m2_after": (sums["m2po_m2_after"] / (trust - sums["m2po_masked"])
                              if trust > sums["m2po_masked"] else None),
        })
    if contrasts:
        rank, world = rank_and_world()
        mine = [j for j in range(len(contrasts))][rank::world]
        after = [s["margin"] for j in mine for _, s in torch.no_grad()(contrast_terms)(
            engine.module, [contrasts[j]], None, pad_id, spec.temperature, spec.gcpo)]
        after_sum, after_n = _sum_over_ranks([sum(after), len(after)])
        start = sums["gc_margin_start"] if spec.optimizer_steps > 1 else sums["gc_margin"]
        metrics.update({
            "gcpo/loss": sums["gc_loss"] / max(n_steps, 1),
            "gcpo/margin": start / len(contrasts),
            "gcpo/margin_after": after_sum / max(after_n, 1),
            "gcpo/gate_closed_frac": sums["gc_closed"] / max(sums["gc_seen"], 1),
        })
    return metrics


_SUM_KEYS = ("loss", "clip_low", "clip_high", "w", "w_absdev", "w_trunc", "entropy", "tokens",
             "train_tokens", "vetoed", "neg_tokens", "neg_rows", "neg_triggered", "triggers", "kl",
             "kl_tokens", "gc_loss", "gc_margin", "gc_margin_start", "gc_closed", "gc_seen",
             "m2po_tokens", "m2po_masked", "m2po_m2_before", "m2po_m2_after")


def grad_norm_of(module) -> float:
    """Total gradient norm before clipping (DeepSpeed clips inside `step`), from whole gradients
    in p.grad (a stage-0 fp32 engine after the reduce)."""
    grads = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


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
