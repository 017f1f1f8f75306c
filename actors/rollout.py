"""Rollout policies at the actor: how many responses each prompt of a work item gets.

The reward must be known here, because adaptive policies (AR3PO's stop-on-first-correct stages,
AERO's rescue rounds) decide whether to keep sampling from it.
"""

from __future__ import annotations

import time

from actors.engines import Completion, Engine
from actors.verifier import Verifier
from protocol.messages import PROTOCOL_VERSION, Group, Sample, Work


def score(tokenizer, verifier: Verifier, completions: list[Completion], answer: str) -> list[bool]:
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    return verifier.score(texts, [answer] * len(texts))


def to_samples(completions: list[Completion], accs: list[bool], version: int,
               stage: int = 0) -> list[Sample]:
    return [Sample(token_ids=c.token_ids, logprobs=c.logprobs, policy_version=version,
                   reward=float(ok), acc=ok, truncated=c.truncated, stage=stage)
            for c, ok in zip(completions, accs)]


def sample_fixed(engine: Engine, tokenizer, verifier: Verifier, work: Work,
                 version: int) -> list[list[Sample]]:
    """Every prompt gets its `n` responses in one engine call (GRPO, DAPO, HORA)."""
    r = work.rollout
    outs = engine.generate([p.prompt_token_ids for p in work.prompts], [p.n for p in work.prompts],
                           r.max_new_tokens, r.temperature, r.top_p)
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for cs in outs for c in cs]
    answers = [p.answer for p, cs in zip(work.prompts, outs) for _ in cs]
    flat = verifier.score(texts, answers)  # one verifier round trip for the whole work item
    groups, at = [], 0
    for cs in outs:
        groups.append(to_samples(cs, flat[at:at + len(cs)], version))
        at += len(cs)
    return groups


def sample_work(engine: Engine, tokenizer, verifier: Verifier, work: Work, actor_id: int,
                version: int) -> list[Group]:
    t0 = time.time()
    match work.rollout.strategy:
        case "fixed":
            per_prompt = sample_fixed(engine, tokenizer, verifier, work, version)
        case other:
            raise ValueError(f"rollout strategy {other!r} is not available in this actor")
    gen_time = (time.time() - t0) / max(len(work.prompts), 1)
    return [Group(protocol_version=PROTOCOL_VERSION, policy_version=version,
                  group_id=p.group_id, prompt_id=p.prompt_id, actor_id=actor_id,
                  work_id=work.work_id, prompt_token_ids=p.prompt_token_ids, samples=samples,
                  gen_time_s=gen_time)
            for p, samples in zip(work.prompts, per_prompt)]
