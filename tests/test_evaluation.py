"""Held-out evaluation with a seed (the learner's, `run.seed`): every evaluation samples from the
same random numbers, so the change between two evaluations measures the policy, not the draw;
and it leaves the global generator alone, so evaluating never changes what training samples."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from learner.data import held_out
from protocol.config import load_config
from tasks.evaluation import evaluate
from tasks.hf_engine import HFEngine
from tasks.tiny_model import load_tokenizer
from tasks.verifier import Verifier
from tests.conftest import TINY


class Recording:
    """An engine that keeps the token ids of every completion it returns."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, *args, **kwargs):
        out = self.engine.generate(*args, **kwargs)
        self.calls.append([[c.token_ids for c in cs] for cs in out])
        return out


def test_a_seeded_evaluation_draws_the_same_samples_and_leaves_the_global_generator(tiny_model):
    cfg = load_config(TINY, [f"model.path={tiny_model}", "task.eval_per_level=4"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = load_tokenizer(tiny_model)
    problems = held_out(cfg)
    verifier = Verifier(cfg.actors.verifier_timeout_s, reward=cfg.task.reward)

    def sampled(seed):
        engine = Recording(HFEngine(model))
        evaluate(engine, tokenizer, problems, verifier, 8, 12, 1.0, cfg.task.prompt_template,
                 seed=seed)
        return engine.calls[0]  # the k samples per prompt (the second call is greedy)

    try:
        torch.manual_seed(123)
        before = torch.get_rng_state()
        first = sampled(0)
        assert torch.equal(torch.get_rng_state(), before)  # the global generator is untouched
        assert sampled(0) == first
        assert sampled(1) != first  # the seed is what fixes the draw
        assert sampled(None) != sampled(None)  # without one, each evaluation draws afresh
        assert not torch.equal(torch.get_rng_state(), before)
    finally:
        verifier.close()
