"""Held-out evaluation: k samples per held-out prompt, eval/avg@k and eval/pass@k (docs/ALGORITHMS.md 10).

`evaluate` samples with any engine that has the actors' `generate` signature. The learner passes
`tasks.hf_engine.HFEngine` around its own weights, so a number logged at step s is the policy of
step s, whatever the actors hold at that moment.

With a `seed`, every evaluation samples from the same random numbers, drawn in the same order,
and the global generator is left as it was. Two evaluations of nearly the same policy then pick
nearly the same tokens, so the change of eval/avg@k between two steps is the policy's change,
not sampling luck (with independent draws two evaluations of one model differ by a sizeable
share of what a short run gains; seeded, they are equal).
"""

from __future__ import annotations

import time

import torch

from tasks.arithmetic import Problem
from tasks.eval_math import pass_at_k
from tasks.prompts import prompt_token_ids
from tasks.verifier import Verifier


def evaluate(engine, tokenizer, problems: list[Problem], verifier: Verifier, k: int,
             max_new_tokens: int, temperature: float, template: str, seed: int | None = None
             ) -> dict:
    t0 = time.time()
    prompts = [prompt_token_ids(tokenizer, p.question, template) for p in problems]
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        outs = engine.generate(prompts, [k] * len(prompts), max_new_tokens, temperature)
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for cs in outs for c in cs]
    answers = [p.answer for p in problems for _ in range(k)]
    fields = [p.fields for p in problems for _ in range(k)]
    ok = [s.acc for s in verifier.judge(texts, answers, fields)]
    correct = [sum(ok[i * k:(i + 1) * k]) for i in range(len(problems))]
    # greedy answers: how much the policy knows, against how often sampling gets it right
    greedy = engine.generate(prompts, [1] * len(prompts), max_new_tokens, temperature=0.0)
    greedy_ok = [s.acc for s in verifier.judge(
        [tokenizer.decode(cs[0].token_ids, skip_special_tokens=True) for cs in greedy],
        [p.answer for p in problems], [p.fields for p in problems])]
    return {**eval_metrics(problems, correct, greedy_ok, k), "timing/eval": time.time() - t0}


def eval_metrics(problems: list[Problem], correct: list[int], greedy_ok: list[bool], k: int
                 ) -> dict:
    """eval/avg@k, eval/pass@k, eval/greedy, overall and per level, from each problem's count
    of correct samples (of k) and its greedy verdict; the learner's evaluation and the actors'
    (learner/actor_eval.py, which adds up the actors' parts) both end here."""
    metrics = {
        f"eval/avg@{k}": sum(correct) / (k * len(problems)),
        f"eval/pass@{k}": sum(pass_at_k(k, c, k) for c in correct) / len(problems),
        "eval/greedy": sum(greedy_ok) / len(problems),
    }
    for level in sorted({p.level for p in problems}):
        idx = [i for i, p in enumerate(problems) if p.level == level]
        metrics[f"eval/avg@{k}/level{level}"] = sum(correct[i] for i in idx) / (k * len(idx))
        metrics[f"eval/pass@{k}/level{level}"] = sum(pass_at_k(k, correct[i], k)
                                                     for i in idx) / len(idx)
        metrics[f"eval/greedy/level{level}"] = sum(greedy_ok[i] for i in idx) / len(idx)
    return metrics
