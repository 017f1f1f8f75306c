"""From a step's scored groups to what the loss trains on, for every algorithm's knobs.

Per group, in this order (docs/ALGORITHMS.md sections in brackets):
  1. rewards: the verifier's 0/1, or DAPO's -1/+1 with overlong shaping [2];
  2. AR3PO reuse: an all-fail group gives one response up for the prompt's newest past correct
     one [3.3]; then the group's fresh correct responses enter the buffer (never reused ones);
  3. advantages: the group estimator [1.2] over the (possibly reused) group, or AERO's curation
     with Beta-posterior advantages for degenerate groups [4.3-4.4];
  4. GCPO: a group that is still all-fail and has a verified golden trajectory gets the
     contrastive term; its failures keep advantage 0 in the policy gradient [6.2];
  5. rows: responses that enter the loss. An advantage-only reused response is only in the
     baseline and makes no row, so it is in no denominator [3.5]; a policy-recomputed one makes
     a row with w = 1; a direct-replay one a row ratioed to its stored log-probs [3.5].
`AlgorithmState` is what the algorithms remember across steps (the reuse buffer, HORA's
per-prompt counts, the curation RNG and run totals); its state_dict is JSON for checkpoints.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from learner.curation import aero_select, rescue_outcome, shaped_reward
from learner.group_metrics import group_advantages
from learner.reuse import ReuseBuffer, ReuseEntry, reuse_into_group
from learner.staleness import staleness_summary
from learner.update import ContrastGroup, LossRow
from protocol.config import Config
from protocol.messages import Group, version_runs
from protocol.staleness import age

_HIST_BINS = 64  # staleness histogram bins past which values share the overflow bin


class AlgorithmState:
    """Cross-step memory of the algorithms, saved in every checkpoint's run state."""

    def __init__(self, cfg: Config):
        self.track_counts = cfg.rollout.policy == "hora"
        self.decay = cfg.hora.decay
        self.reuse = ReuseBuffer(cfg.ar3po.buffer_size)
        self.counts: dict[str, list[float]] = {}  # prompt_id -> [correct, incorrect] (HORA)
        self.rng = random.Random(cfg.run.seed)
        self.totals: Counter = Counter()  # run totals behind the */run metrics

    def observe(self, group: Group) -> None:
        """Every generated group updates its prompt's Beta counts (HORA's posterior, 7.3)."""
        if not self.track_counts:
            return
        c = sum(s.acc for s in group.samples)
        old_c, old_f = self.counts.get(group.prompt_id, (0.0, 0.0))
        self.counts[group.prompt_id] = [self.decay * old_c + c,
                                        self.decay * old_f + len(group.samples) - c]

    def prompt_counts(self, prompt_id: str) -> tuple[float, float]:
        c, f = self.counts.get(prompt_id, (0.0, 0.0))
        return c, f

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"reuse": self.reuse.state_dict(),
                "counts": [[p, c, f] for p, (c, f) in self.counts.items()],
                "rng": [version, list(internal), gauss],
                "totals": dict(self.totals)}

    def load_state_dict(self, state: dict) -> None:
        self.reuse.load_state_dict(state["reuse"])
        self.counts = {p: [c, f] for p, c, f in state["counts"]}
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.totals = Counter(state["totals"])


@dataclass
class Member:
    """One response of a group on its way to the loss."""

    token_ids: list[int]
    logprobs: list[float]
    policy_version: int
    reward: float
    acc: bool
    fresh: bool = True
    in_loss: bool = True
    reuse: str = ""  # ar3po.reuse_mode of a reused response, "" when fresh (LossRow.reuse)
    version_runs: list[tuple[int, int]] = field(default_factory=list)  # (version, tokens)


@dataclass
class StepBatch:
    rows: list[LossRow]
    contrasts: list[ContrastGroup]
    metrics: dict = field(default_factory=dict)


def reuse_member(entry: ReuseEntry, mode: str, reward: float) -> Member:
    """A past correct response standing in for a failure, as reuse `mode` treats it (3.5)."""
    return Member(list(entry.token_ids), list(entry.logprobs), entry.policy_version, reward,
                  acc=True, fresh=False, in_loss=mode != "advantage_only", reuse=mode)


@dataclass
class Tally:
    """What a step's groups add up to, for the metrics."""

    n: Counter = field(default_factory=Counter)
    reuse_ages: list[tuple[int, int]] = field(default_factory=list)  # (versions, steps)
    strata: Counter = field(default_factory=Counter)
    rescue_rounds: Counter = field(default_factory=Counter)
    fresh_stale: list[tuple[int, int]] = field(default_factory=list)  # (staleness, tokens)
    oldest_stale: list[int] = field(default_factory=list)  # per fresh response, oldest token


def build_step(groups: list[Group], state: AlgorithmState, cfg: Config, version: int, step: int,
               goldens: dict[str, list[int]]) -> StepBatch:
    """Rows and contrast groups for the loss, and the step's group metrics (section 9).
    `goldens`: group id -> verified golden response token ids, for all-fail groups (GCPO)."""
    batch, tally = StepBatch([], []), Tally()
    for g in groups:
        members = [Member(s.token_ids, s.logprobs, s.policy_version,
                          shaped_reward(s.reward, len(s.token_ids), cfg.dapo,
                                        cfg.rollout.max_new_tokens), s.acc,
                          in_loss=not (cfg.dapo.overlong == "filter" and s.truncated),
                          version_runs=version_runs(s))
                   for s in g.samples]
        if cfg.ar3po.reuse_mode != "off":
            _reuse(g, members, state, cfg, version, step, tally)
        if rescues(cfg):
            _rescue(g, cfg, tally)
        keep, adv = _advantages(g, members, state, cfg, tally)
        _to_loss(g, [members[i] for i in keep], adv, cfg, version, goldens, batch, tally)
    state.totals.update({k: tally.n[k] for k in ("all_fail", "reused", "needed_rescue", "rescued")})
    batch.metrics = _step_metrics(cfg, state, len(groups), len(batch.rows), len(batch.contrasts),
                                  tally)
    batch.metrics.update(staleness_summary([v for v, _ in tally.fresh_stale],
                                           min(cfg.staleness.admitted, _HIST_BINS),
                                           weights=[w for _, w in tally.fresh_stale]))
    # the bound (8.2) applies to a response's oldest token, which is at least as stale
    batch.metrics["stale/oldest_token_max"] = float(max(tally.oldest_stale, default=0))
    return batch


def _reuse(g: Group, members: list[Member], state: AlgorithmState, cfg: Config, version: int,
           step: int, tally: Tally) -> None:
    """AR3PO (3.3): an all-fail group swaps a response for a past correct one (the newest, or
    any under ar3po.buffer_pick uniform); then the group's fresh correct responses enter the
    buffer (never a reused one)."""
    accs = [s.acc for s in g.samples]
    if not any(accs):
        tally.n["all_fail"] += 1
        entry = state.reuse.pick(g.prompt_id, cfg.ar3po.buffer_pick, state.rng)
        if entry is None:
            tally.n["unavailable"] += 1
        else:
            reward = shaped_reward(entry.reward, len(entry.token_ids), cfg.dapo,
                                   cfg.rollout.max_new_tokens)
            members[reuse_into_group(accs, state.rng)] = reuse_member(entry, cfg.ar3po.reuse_mode,
                                                                      reward)
            tally.n["reused"] += 1
            tally.reuse_ages.append((version - entry.policy_version, step - entry.step))
    # advantage-only reuse never trains on the stored response, and only its length can change
    # its reward (overlong shaping): keep tokens only when needed (memory and checkpoint size)
    keep = cfg.ar3po.reuse_mode != "advantage_only" or cfg.dapo.overlong == "shaping"
    for s in g.samples:
        if s.acc:
            state.reuse.add(g.prompt_id, ReuseEntry(s.token_ids if keep else (),
                                                    s.logprobs if keep else (),
                                                    s.policy_version, step, s.reward))


def rescues(cfg: Config) -> bool:
    """Rollout policies that sample more for a prompt whose first stage failed: AR3PO's later
    stages, AERO's rescue rounds, HORA two-phase's rest after the probe (`rescue/*`)."""
    return cfg.rollout.policy in ("stop_on_correct", "aero") or (
        cfg.rollout.policy == "hora" and cfg.hora.two_phase)


def _rescue(g: Group, cfg: Config, tally: Tally) -> None:
    """Did a prompt that failed the first stage (AERO: exploration; HORA: the probe) get a
    correct response later?"""
    threshold = cfg.aero.rescue_threshold if cfg.rollout.policy == "aero" else 0
    outcome = rescue_outcome([s.acc for s in g.samples], [s.stage for s in g.samples], threshold)
    if outcome is not None:
        tally.n["needed_rescue"] += 1
        if outcome > 0:
            tally.n["rescued"] += 1
            tally.rescue_rounds[outcome] += 1


def _advantages(g: Group, members: list[Member], state: AlgorithmState, cfg: Config,
                tally: Tally) -> tuple[list[int], list[float]]:
    """Kept members and their advantages: the whole group, or AERO's curated subset (4.4)."""
    if not cfg.aero.curate:
        return list(range(len(members))), group_advantages([m.reward for m in members], cfg.loss)
    keep, adv, stratum = aero_select([m.acc for m in members], [s.stage for s in g.samples],
                                     [m.reward for m in members], cfg.aero, cfg.loss, state.rng)
    tally.strata[stratum] += 1
    tally.strata["degenerate"] += len({m.acc for m in members}) == 1
    return keep, adv


def _to_loss(g: Group, kept: list[Member], adv: list[float], cfg: Config, version: int,
             goldens: dict[str, list[int]], batch: StepBatch, tally: Tally) -> None:
    """The group's rows (and GCPO contrast) for the loss, and its zero-advantage accounting."""
    accs = [m.acc for m in kept]
    if all(a == 0.0 for a, m in zip(adv, kept) if m.in_loss):
        tally.n["zero_adv"] += 1
        tally.n["zero_adv_all_fail"] += not any(accs)
        tally.n["zero_adv_all_correct"] += all(accs)
    if cfg.gcpo.coef > 0 and not any(accs):
        golden = goldens.get(g.group_id)
        if golden:
            batch.contrasts.append(ContrastGroup(g.prompt_token_ids, golden,
                                                 [m.token_ids for m in kept if m.fresh]))
        else:
            tally.n["no_golden"] += 1
    scale = cfg.staleness.loss_scale(age(g, version))
    for m, a in zip(kept, adv):
        if not m.in_loss:
            continue
        batch.rows.append(LossRow(g.prompt_token_ids, m.token_ids, m.logprobs, a,
                                  m.policy_version, scale if m.fresh else 1.0, g.group_id,
                                  reuse=m.reuse))
        tally.n["train_reward"] += m.reward
        if m.fresh:  # reused responses are exempt from the staleness rules and stats (8.4)
            # stale/* count tokens, each at the version that sampled it (8.1, section 9)
            tally.fresh_stale += [(version - v, n) for v, n in m.version_runs]
            tally.oldest_stale.append(version - m.policy_version)


def _frac(num: float, den: float) -> float:
    return num / den if den else 0.0


def _step_metrics(cfg: Config, state: AlgorithmState, num_groups: int, num_rows: int,
                  num_contrasts: int, tally: Tally) -> dict:
    t, n, ages = state.totals, tally.n, tally.reuse_ages
    m = {
        "groups/frac_zero_adv_final": _frac(n["zero_adv"], num_groups),
        "groups/frac_zero_adv_final_all_fail": _frac(n["zero_adv_all_fail"], num_groups),
        "groups/frac_zero_adv_final_all_correct": _frac(n["zero_adv_all_correct"], num_groups),
        "train/rollouts_per_prompt": _frac(num_rows, num_groups),
        "train/rows": num_rows,
        "reward/train_mean": _frac(n["train_reward"], num_rows),
    }
    if cfg.ar3po.reuse_mode != "off":
        m.update({
            "reuse/rate": _frac(n["reused"], n["all_fail"]),
            "reuse/all_fail": n["all_fail"],
            "reuse/reused": n["reused"],
            "reuse/unavailable": n["unavailable"],
            "reuse/age_mean": float(np.mean([v for v, _ in ages])) if ages else None,
            "reuse/age_steps_mean": float(np.mean([s for _, s in ages])) if ages else None,
            "reuse/buffer_prompts": len(state.reuse),
            "reuse/rate_run": _frac(t["reused"], t["all_fail"]),
        })
    if rescues(cfg):
        rounds = tally.rescue_rounds
        m.update({
            "rescue/frac_rescued": _frac(n["rescued"], n["needed_rescue"]),
            "rescue/needed": n["needed_rescue"],
            "rescue/by_round": [rounds[r] for r in range(1, max(rounds, default=0) + 1)],
            "rescue/frac_rescued_run": _frac(t["rescued"], t["needed_rescue"]),
        })
    if cfg.aero.curate:
        for key in ("rescue", "low", "high", "degenerate"):
            m[f"aero/frac_{key}"] = _frac(tally.strata[key], num_groups)
    if cfg.gcpo.coef > 0:
        m["gcpo/active_frac"] = _frac(num_contrasts, num_groups)
        m["gcpo/no_golden"] = n["no_golden"]
    if state.track_counts:
        m["hora/prompts_tracked"] = len(state.counts)
    return m
