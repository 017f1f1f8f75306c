"""The HF engine's behaviour log-probs are those of the model it samples from, and `pack` lines
them up with the learner's forward pass, so an on-policy ratio is exactly 1."""

from __future__ import annotations

import torch

from actors.engines.hf import HFEngine
from tasks.prompts import prompt_token_ids
from tasks.tiny_model import build_model, build_tokenizer
from learner.batch import Row, pack
from learner.logprobs import token_logp


def tiny():
    tok = build_tokenizer()
    model = build_model(tok, hidden=32, layers=1, heads=2, ffn=64, seed=1).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return tok, model


def sampled_rows(tok, model, temperature):
    prompts = [prompt_token_ids(tok, q) for q in ["1+2=", "47+385=", "9-3="]]
    torch.manual_seed(0)
    outs = HFEngine(model).generate(prompts, [3, 2, 4], max_new_tokens=6, temperature=temperature)
    assert [len(o) for o in outs] == [3, 2, 4]
    return [Row(p, c.token_ids, c.logprobs, 1.0, 0) for p, cs in zip(prompts, outs) for c in cs]


def gap(model, packed, temperature):
    with torch.no_grad():
        logp, _ = token_logp(model, packed, temperature)
    return float(((logp - packed.behav_logp) * packed.mask).abs().max())


def test_sampled_logprobs_match_a_full_forward_pass_of_the_same_weights():
    tok, model = tiny()
    assert gap(model, pack(sampled_rows(tok, model, 1.0), tok.pad_token_id), 1.0) < 1e-4


def test_at_temperature_0_7_the_learner_matches_the_sampler_only_at_the_same_temperature():
    tok, model = tiny()
    packed = pack(sampled_rows(tok, model, 0.7), tok.pad_token_id)
    assert gap(model, packed, 0.7) < 1e-4
    assert gap(model, packed, 1.0) > 1e-2  # T = 1 on the learner: every ratio biased


def test_completions_stop_at_eos_or_are_marked_truncated():
    tok, model = tiny()
    outs = HFEngine(model).generate([prompt_token_ids(tok, "5+5=")], [16], max_new_tokens=3)
    for c in outs[0]:
        assert len(c.token_ids) == len(c.logprobs) <= 3
        ends_with_eos = c.token_ids[-1] == tok.eos_token_id
        assert c.truncated == (not ends_with_eos)
        assert tok.eos_token_id not in c.token_ids[:-1]


def test_pack_marks_exactly_the_response_targets():
    row = Row(prompt=[5, 6, 7], response=[8, 9], behav_logp=[-0.5, -0.25], adv=1.0,
              policy_version=0)
    packed = pack([row, Row([5], [8], [-1.0], 0.0, 0)], pad_id=0)
    assert packed.targets[0].tolist() == [6, 7, 8, 9]
    assert packed.mask[0].tolist() == [0, 0, 1, 1]
    assert packed.behav_logp[0].tolist() == [0, 0, -0.5, -0.25]
    assert packed.mask[1].tolist() == [1, 0, 0, 0]
