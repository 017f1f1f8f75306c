"""Rollout policies at the actor: how many responses each prompt of a work item gets.

The reward must be known here, because adaptive policies (AR3PO's stop-on-first-correct stages,
AERO's rescue rounds, HORA's two-phase probe) decide whether to keep sampling from it. Every
policy is a loop of `generate_and_score` calls, one engine call and one verifier round trip each:
  fixed           - one call, `Prompt.n` responses per prompt (GRPO, DAPO, Mu-GRPO);
  stop_on_correct - one call per stage over the prompts still without a correct response
                    (AR3PO, 3.2);
  aero            - one exploration call, then rescue rounds over the prompts still failing,
                    drawn from a budget pooled over the work item's prompts (AERO, 4.4);
  hora            - the work item's budget allocated by hit utility under the learner's
                    posterior counts, in one call; two-phase: a probe call, then one call for
                    the rest over the prompts the probe missed (HORA, 7.3).
The pooled budgets are the work item's: the aero and hora presets hand out a whole step's prompts
as one work item, so they pool over the step. Each Sample records the stage (AERO: round; HORA:
0 = probe, 1 = rest) that produced it, so the learner can tell them apart. Section numbers are
ALGORITHMS.md.
"""

from __future__ import annotations

import random
import time

from actors.allocation import hora_allocate, hora_second_phase
from actors.engines import Completion, Engine
from tasks.verifier import Verifier
from protocol.messages import PROTOCOL_VERSION, Group, Prompt, RolloutSpec, Sample, Work


def score(tokenizer, verifier: Verifier, completions: list[Completion], answer: str) -> list[bool]:
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    return verifier.score(texts, [answer] * len(texts))


def to_samples(completions: list[Completion], accs: list[bool], version: int,
               stage: int = 0) -> list[Sample]:
    return [Sample(token_ids=c.token_ids, logprobs=c.logprobs, policy_version=version,
                   reward=float(ok), acc=ok, truncated=c.truncated, stage=stage)
            for c, ok in zip(completions, accs)]


def generate_and_score(engine: Engine, tokenizer, verifier: Verifier, prompts: list[Prompt],
                       n: list[int], spec: RolloutSpec, version: int,
                       stage: int = 0) -> list[list[Sample]]:
    """n[i] scored samples of prompts[i]: one engine call, one verifier round trip."""
    outs = engine.generate([p.prompt_token_ids for p in prompts], n, spec.max_new_tokens,
                           spec.temperature, spec.top_p)
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for cs in outs for c in cs]
    answers = [p.answer for p, cs in zip(prompts, outs) for _ in cs]
    flat = verifier.score(texts, answers) if texts else []
    groups, at = [], 0
    for cs in outs:
        groups.append(to_samples(cs, flat[at:at + len(cs)], version, stage))
        at += len(cs)
    return groups


def sample_fixed(engine: Engine, tokenizer, verifier: Verifier, work: Work,
                 version: int) -> list[list[Sample]]:
    """Every prompt gets its `n` responses in one engine call (GRPO, DAPO, Mu-GRPO)."""
    return generate_and_score(engine, tokenizer, verifier, work.prompts,
                              [p.n for p in work.prompts], work.rollout, version)


def sample_stop_on_correct(engine: Engine, tokenizer, verifier: Verifier, work: Work,
                           version: int) -> list[list[Sample]]:
    """AR3PO (3.2): stage s samples stage_sizes[s] responses for every prompt that has no
    correct response yet, so a prompt gets at most sum(stage_sizes)."""
    groups: list[list[Sample]] = [[] for _ in work.prompts]
    active = list(range(len(work.prompts)))
    for stage, k in enumerate(work.rollout.stage_sizes):
        if not active:
            break
        outs = generate_and_score(engine, tokenizer, verifier, [work.prompts[i] for i in active],
                                  [k] * len(active), work.rollout, version, stage)
        for i, samples in zip(active, outs):
            groups[i] += samples
        active = [i for i in active if not any(s.acc for s in groups[i])]
    return groups


def sample_aero(engine: Engine, tokenizer, verifier: Verifier, work: Work,
                version: int) -> list[list[Sample]]:
    """AERO (4.4): explore, then rescue rounds of `aero_rescue_step` responses for prompts with
    at most `aero_rescue_threshold` correct, until each has a correct response, the rounds run
    out or the pooled budget (aero_rescue_budget_per_prompt x the work item's prompts) cannot
    pay a round. A
    round visits the still-failing prompts in random order and stops where the budget ends (a
    partial last round); unused budget is not carried over (4.4 [I])."""
    spec, prompts = work.rollout, work.prompts
    rng = random.Random(work.work_id)  # reproducible per work item
    groups = generate_and_score(engine, tokenizer, verifier, prompts,
                                [spec.aero_explore] * len(prompts), spec, version)
    budget = spec.aero_rescue_budget_per_prompt * len(prompts)
    step = spec.aero_rescue_step
    active = [i for i, g in enumerate(groups)
              if sum(s.acc for s in g) <= spec.aero_rescue_threshold]
    rounds = 0
    while active and rounds < spec.aero_max_rounds and budget >= step:
        order = rng.sample(active, len(active))
        chosen = [i for i in order if len(groups[i]) + step <= spec.aero_max_per_prompt]
        chosen = chosen[:budget // step]
        if not chosen:
            break
        rounds += 1
        outs = generate_and_score(engine, tokenizer, verifier, [prompts[i] for i in chosen],
                                  [step] * len(chosen), spec, version, stage=rounds)
        for i, samples in zip(chosen, outs):
            groups[i] += samples
        budget -= step * len(chosen)
        active = [i for i in active if not any(s.acc for s in groups[i])]
    return groups


def sample_hora(engine: Engine, tokenizer, verifier: Verifier, work: Work,
                version: int) -> list[list[Sample]]:
    """HORA (7.3): `hora_budget_per_prompt` x the work item's prompts responses, allocated by
    greedy hit utility under each prompt's posterior counts (k_min..k_max each). Two-phase:
    a probe of k_min per prompt first; the rest of the budget then goes to the prompts the probe
    missed, under their posteriors updated with the probe (a hit leaves residual utility 0)."""
    spec, prompts = work.rollout, work.prompts
    budget = spec.hora_budget_per_prompt * len(prompts)
    counts = [(p.prior_correct, p.prior_incorrect) for p in prompts]
    if not spec.hora_two_phase:
        n = hora_allocate(counts, budget, spec.hora_k_min, spec.hora_k_max)
        return generate_and_score(engine, tokenizer, verifier, prompts, n, spec, version)
    k_min = spec.hora_k_min
    groups = generate_and_score(engine, tokenizer, verifier, prompts, [k_min] * len(prompts),
                                spec, version, stage=0)
    rest = hora_second_phase(counts, [sum(s.acc for s in g) for g in groups], k_min,
                             budget - k_min * len(prompts), spec.hora_k_max - k_min)
    chosen = [i for i, k in enumerate(rest) if k > 0]
    if chosen:
        outs = generate_and_score(engine, tokenizer, verifier, [prompts[i] for i in chosen],
                                  [rest[i] for i in chosen], spec, version, stage=1)
        for i, samples in zip(chosen, outs):
            groups[i] += samples
    return groups


def sample_work(engine: Engine, tokenizer, verifier: Verifier, work: Work, actor_id: int,
                version: int) -> list[Group]:
    t0 = time.time()
    match work.rollout.strategy:
        case "fixed":
            per_prompt = sample_fixed(engine, tokenizer, verifier, work, version)
        case "stop_on_correct":
            per_prompt = sample_stop_on_correct(engine, tokenizer, verifier, work, version)
        case "aero":
            per_prompt = sample_aero(engine, tokenizer, verifier, work, version)
        case "hora":
            per_prompt = sample_hora(engine, tokenizer, verifier, work, version)
        case other:
            raise ValueError(f"rollout strategy {other!r} is not available in this actor")
    gen_time = (time.time() - t0) / max(len(work.prompts), 1)
    return [Group(protocol_version=PROTOCOL_VERSION, policy_version=version,
                  group_id=p.group_id, prompt_id=p.prompt_id, actor_id=actor_id,
                  work_id=work.work_id, prompt_token_ids=p.prompt_token_ids, samples=samples,
                  gen_time_s=gen_time)
            for p, samples in zip(work.prompts, per_prompt)]
