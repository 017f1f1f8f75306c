"""The HF engine's decode loop: behaviour log-probs are those of a full forward pass of the same
weights, whatever requests come and go around a row; every token is tagged with the version of
the weights that sampled it; `pack` lines the log-probs up with the learner's forward pass."""

from __future__ import annotations

import pytest
import torch

from tasks.hf_engine import HFEngine, sample_tokens
from learner.batch import Row, pack
from learner.logprobs import token_logp
from tasks.prompts import prompt_token_ids
from tasks.tiny_model import build_model, build_tokenizer
from tests.logprob_refs import full_forward_logp, kept_kv_logp


def tiny(seed: int = 1):
    tok = build_tokenizer()
    model = build_model(tok, hidden=32, layers=2, heads=2, ffn=64, seed=seed).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return tok, model


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_cached_decode_logprobs_match_a_full_forward_while_requests_come_and_go(temperature):
    tok, model = tiny()
    prompts = [prompt_token_ids(tok, q) for q in ["1+2=", "47+385=", "9-3=", "123+4567="]]
    engine = HFEngine(model, max_batch=5)  # fewer rows than requests: some wait for a free row
    torch.manual_seed(0)
    owner, done, aborted = {}, {}, []
    for step in range(80):
        if step % 3 == 0 and len(owner) < 12:  # a new request every third step
            rid = len(owner)
            owner[rid] = prompts[rid % 4]
            engine.add(rid, owner[rid], max_new_tokens=12, temperature=temperature)
        if step == 7:
            aborted = engine.abort([1, 2])
        done.update((f.request_id, f) for f in engine.step())
    assert engine.unfinished() == 0
    assert sorted(a.request_id for a in aborted) == [1, 2]
    assert sorted(done) == [r for r in range(12) if r not in (1, 2)]
    for rid, f in done.items():
        assert len(f.token_ids) == len(f.logprobs) <= 12
        ref = full_forward_logp(model, owner[rid], f.token_ids, temperature)
        assert (torch.tensor(f.logprobs) - ref).abs().max() < 1e-5, rid


def test_tokens_sampled_after_a_weight_update_carry_the_new_version():
    tok, model = tiny()
    prompt = prompt_token_ids(tok, "47+385=")
    engine = HFEngine(model)
    torch.manual_seed(0)
    engine.add(0, prompt, max_new_tokens=10)
    for _ in range(4):
        assert engine.step() == []
    _, new_model = tiny(seed=2)
    with torch.no_grad():  # the broadcast writes into the live parameters between two steps
        for (_, p), (_, q) in zip(engine.weight_targets(), new_model.named_parameters()):
            p.copy_(q)
    engine.commit_weights()
    engine.policy_version = 1
    done = []
    while engine.unfinished():
        done += engine.step()
    f = done[0]
    assert f.version_runs[0] == (0, 4) and f.version_runs[1][0] == 1
    assert sum(n for _, n in f.version_runs) == len(f.token_ids)
    # the first four tokens were sampled with the old weights: their log-probs are the old ones
    _, old_model = tiny()
    ref = full_forward_logp(old_model, prompt, f.token_ids, 1.0)
    assert (torch.tensor(f.logprobs[:4]) - ref[:4]).abs().max() < 1e-5
    # the rest: the new weights decoding over the KV the old ones computed (prompt + the first
    # three tokens; the fourth is fed in by the first step after the update)
    kept = kept_kv_logp(old_model, new_model, prompt, f.token_ids, kept=3)
    assert (torch.tensor(f.logprobs[4:]) - kept).abs().max() < 1e-5
    assert (kept - ref[4:]).abs().max() > 1e-3  # which the old weights would not give,
    recomputed = full_forward_logp(new_model, prompt, f.token_ids, 1.0)[4:]
    assert (kept - recomputed).abs().max() > 1e-4  # nor the new ones with the KV recomputed



def test_requests_stop_at_eos_or_are_marked_truncated():
    tok, model = tiny()
    engine = HFEngine(model)
    outs = engine.generate([prompt_token_ids(tok, "5+5=")], [16], max_new_tokens=3)
    for c in outs[0]:
        assert len(c.token_ids) == len(c.logprobs) <= 3
        ends_with_eos = c.token_ids[-1] == tok.eos_token_id
        assert c.truncated == (not ends_with_eos)
        assert tok.eos_token_id not in c.token_ids[:-1]


def test_abort_reports_the_tokens_generated_and_frees_the_row():
    tok, model = tiny()
    engine = HFEngine(model, max_batch=1)
    p = prompt_token_ids(tok, "1+1=")
    engine.add(0, p, max_new_tokens=50)
    engine.add(1, p, max_new_tokens=50)
    engine.step()
    engine.step()
    assert engine.running() == [0]  # request 1 waits for the one row
    (gone,) = engine.abort([0])
    assert gone.request_id == 0 and gone.tokens == 2
    engine.step()
    assert engine.running() == [1]
    assert engine.abort([7]) == []


def test_greedy_rows_take_the_argmax_and_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    torch.manual_seed(0)
    for _ in range(20):
        tokens, logp = sample_tokens(logits, torch.tensor([0.0, 1.0, 1.0]),
                                     torch.tensor([1.0, 0.5, 1.0]))
        assert tokens[0] == 1 and tokens[1] == 0  # row 1: token 0 alone holds > half the mass
    assert torch.allclose(logp[0], torch.log_softmax(logits[0], -1)[1])


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


def test_pack_marks_exactly_the_response_targets():
    row = Row(prompt=[5, 6, 7], response=[8, 9], behav_logp=[-0.5, -0.25], adv=1.0,
              policy_version=0)
    packed = pack([row, Row([5], [8], [-1.0], 0.0, 0)], pad_id=0)
    assert packed.targets[0].tolist() == [6, 7, 8, 9]
    assert packed.mask[0].tolist() == [0, 0, 1, 1]
    assert packed.behav_logp[0].tolist() == [0, 0, -0.5, -0.25]
    assert packed.mask[1].tolist() == [1, 0, 0, 0]


def test_a_long_row_beside_rows_that_come_and_go_keeps_exact_logprobs_as_the_cache_moves():
    """150 tokens with short rows joining and leaving around it: the cache runs out of columns
    (its live window moves to the front) and frees half its slots (the live ones move), and
    every row's log-probs stay those of one full forward pass."""
    tok, model = tiny()
    engine = HFEngine(model)
    torch.manual_seed(1)
    owner, done = {0: prompt_token_ids(tok, "123+4567=")}, {}
    engine.add(0, owner[0], max_new_tokens=150)
    for step in range(400):
        if step % 7 == 0 and step < 140:
            rid = len(owner)
            owner[rid] = prompt_token_ids(tok, f"{rid}+{step}=")
            engine.add(rid, owner[rid], max_new_tokens=4 + rid % 9)
        done.update((f.request_id, f) for f in engine.step())
        if not engine.unfinished():
            break
    assert sorted(done) == sorted(owner) and len(done[0].token_ids) > 100
    for rid, f in done.items():
        ref = full_forward_logp(model, owner[rid], f.token_ids, 1.0)
        assert (torch.tensor(f.logprobs) - ref).abs().max() < 1e-5, rid


def test_a_prompt_wider_than_the_cache_so_far_joins_an_emptied_engine():
    """A short request ends, the engine is empty, and a longer prompt comes: its prefill needs
    columns left of where the cache started (the actor hit this between two syncs)."""
    tok, model = tiny()
    engine = HFEngine(model)
    torch.manual_seed(2)
    short, wide = prompt_token_ids(tok, "1+2="), prompt_token_ids(tok, "1234+5678+91011+121314=")
    engine.add(0, short, max_new_tokens=2)
    while engine.unfinished():
        engine.step()
    engine.add(1, wide, max_new_tokens=6)
    done = []
    while engine.unfinished():
        done += engine.step()
    ref = full_forward_logp(model, wide, done[0].token_ids, 1.0)
    assert (torch.tensor(done[0].logprobs) - ref).abs().max() < 1e-5


def test_rows_admitted_together_are_prefilled_in_one_forward_pass_and_decoded_in_one():
    """The batching the planner's decode probe measures: 64 waiting requests cost one padded
    prefill pass, and the next step one decode pass of all 64 rows, not a pass per row."""
    tok, model = tiny()
    engine = HFEngine(model, max_batch=64)
    prompts = [prompt_token_ids(tok, f"{i}+{7 * i}=") for i in range(64)]
    shapes = []
    model.register_forward_pre_hook(lambda _, args, kwargs: shapes.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    for rid, p in enumerate(prompts):
        engine.add(rid, p, max_new_tokens=4)
    engine.step()
    assert shapes == [(64, max(map(len, prompts)))]
    running = len(engine.running())  # those whose first token was not the end
    engine.step()
    assert len(shapes) == 2 and shapes[1][1] == 1 and shapes[1][0] >= running > 32
