"""The vLLM engine's pure helpers, and its thin class driven by a stand-in `vllm` module, on a
machine without vLLM: requests carry every sampling knob explicitly, the sampled token's log-prob
is read from vLLM's per-position dicts, staging tensors have exactly the learner's parameter names
and shapes (so a real weight broadcast fills them), and a missing vLLM fails with the install
hint. What only a GPU with vLLM can check (real sampling, real `load_weights`) is in
scripts/gpu_check.py."""

import dataclasses
import socket
import sys
import threading
import types

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, Qwen2Config

from actors.engines import Completion, make_engine
from actors.engines.vllm import (INSTALL_HINT, VLLMEngine, allocate_staging, build_requests,
                                 completion_from_output, engine_kwargs, hf_to_vllm_names,
                                 staging_specs)
from tasks.tiny_model import build_tiny
from protocol.weights import WeightGroup

EOS = 1


@dataclasses.dataclass
class Logprob:  # the shape of vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


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
    assert "max_model_len" not in kw
    assert engine_kwargs("m", max_model_len=4096)["max_model_len"] == 4096


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
    assert staging_specs(str(tiny)) == [(n, tuple(p.shape)) for n, p in learner.named_parameters()]


def test_tied_embeddings_are_staged_once(tiny):
    names = [n for n, _ in staging_specs(str(tiny))]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_untied_head_is_staged(tmp_path):
    Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1,
                tie_word_embeddings=False).save_pretrained(tmp_path)
    specs = dict(staging_specs(str(tmp_path)))
    assert specs["lm_head.weight"] == (64, 32)
    assert specs["model.layers.0.self_attn.k_proj.weight"] == (16, 32)  # grouped-query k/v


def test_staged_names_are_checkpoint_names_that_vllm_loads(tiny):
    names = [n for n, _ in staging_specs(str(tiny))]
    with safe_open(tiny / "model.safetensors", "pt") as f:
        assert sorted(hf_to_vllm_names(names)) == sorted(f.keys())
    assert hf_to_vllm_names(names) == names  # Qwen2: no renaming, vLLM fuses q/k/v itself


def test_staging_buffers_have_the_engine_dtype_and_device(tiny):
    staging = allocate_staging(staging_specs(str(tiny)), torch.bfloat16, "cpu")
    assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for _, t in staging)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_weight_broadcast_from_a_bf16_learner_fills_the_staging_tensors(tiny):
    learner = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16)
    staging = allocate_staging(staging_specs(str(tiny)), torch.bfloat16, "cpu")
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
    with pytest.raises(ImportError, match=r"pip install -e '\.\[vllm\]' on a GPU machine"):
        VLLMEngine(str(tiny), device="cpu")
    with pytest.raises(ImportError, match="vLLM is not installed"):
        make_engine("vllm", str(tiny), device="cpu")
    assert "vLLM is not installed" in INSTALL_HINT


class FakeLLM:
    """Stands in for vllm.LLM: records calls; sample j of a prompt is [prompt[0], EOS] when j is
    even, else max_tokens copies of prompt[0] (truncated)."""

    def __init__(self, **kwargs):
        self.kwargs, self.loaded, self.resets = kwargs, [], 0
        self.model = types.SimpleNamespace(load_weights=lambda weights: self.loaded.append(weights))

    def generate(self, prompts, params, use_tqdm=True):
        outs = []
        for prompt, sp in zip(prompts, params):
            first = prompt["prompt_token_ids"][0]
            samples = [[first, EOS] if j % 2 == 0 else [first] * sp.max_tokens for j in range(sp.n)]
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=ids, logprobs=[{t: Logprob(-0.25 * (k + 1))} for k, t in enumerate(ids)])
                for ids in samples]))
        return outs

    def collective_rpc(self, fn, args=()):
        return [fn(types.SimpleNamespace(get_model=lambda: self.model), *args)]

    def reset_prefix_cache(self):
        self.resets += 1
        return True  # vLLM says whether it could (not while requests hold blocks)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # restored after the test
    return module


def test_engine_builds_vllm_in_process_with_its_settings(tiny, fake_vllm):
    import os
    engine = VLLMEngine(str(tiny), device="cpu", gpu_memory_utilization=0.3, seed=7)
    assert engine._llm.kwargs == engine_kwargs(str(tiny), "bfloat16", 0.3, True, None, 7, False)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert engine.eos_token_ids == [EOS]  # from the checkpoint's generation_config


def test_engine_returns_n_completions_per_prompt_in_order(tiny, fake_vllm):
    engine = VLLMEngine(str(tiny), device="cpu")
    out = engine.generate([[10, 11], [20], [30]], n=[2, 0, 3], max_new_tokens=4)
    assert [len(g) for g in out] == [2, 0, 3]
    assert out[0][0] == Completion([10, EOS], [-0.25, -0.5], truncated=False)
    assert out[2][1] == Completion([30] * 4, [-0.25, -0.5, -0.75, -1.0], truncated=True)
    assert engine.generate([[1]], n=[0], max_new_tokens=4) == [[]]


def test_commit_hands_the_staged_tensors_to_vllm_and_drops_stale_kv(tiny, fake_vllm):
    engine = VLLMEngine(str(tiny), device="cpu")
    targets = engine.weight_targets()
    assert [(n, tuple(t.shape)) for n, t in targets] == staging_specs(str(tiny))
    assert all(t.dtype == torch.bfloat16 for _, t in targets)
    engine.commit_weights()
    (loaded,) = engine._llm.loaded
    assert [n for n, _ in loaded] == [n for n, _ in targets]
    assert all(a is b for (_, a), (_, b) in zip(loaded, targets))  # by reference, no copy
    assert engine._llm.resets == 1
