"""Checkpoints of a real DeepSpeed engine (CPU, gloo, one rank, in-process) round-trip exactly.

Run: .venv/bin/pytest tests/test_checkpoint.py -q
"""

from __future__ import annotations

import copy
import json
import logging
import random
import socket

import numpy as np
import pytest
import torch

from learner.checkpoint import (CheckpointError, checkpoint_dir, latest_checkpoint, load_checkpoint,
                                rng_state, save_checkpoint, set_rng_state)

needs_deepspeed = pytest.mark.deepspeed


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(30)} | {"<unk>": 30, "<eos>": 31}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                                   pad_token="<eos>")


def tiny_model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=32,
                         max_position_embeddings=64, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


@pytest.fixture(scope="module")
def deepspeed_dist():
    """One-rank gloo process group for DeepSpeed, torn down after this module."""
    import deepspeed  # a dependency: missing, it fails
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp = pytest.MonkeyPatch()
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                           LOCAL_RANK="0", WORLD_SIZE="1").items():
        mp.setenv(key, value)
    # One rank needs no shared-memory allreduce: skip building DeepSpeed's shm kernel (a ~2 min
    # C++ compile on a machine without a TORCH_EXTENSIONS_DIR cache).
    mp.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")
    yield deepspeed
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    mp.undo()


def make_engine(deepspeed, stage: int = 0, seed: int = 0):
    model = tiny_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                      config=config)
    return engine


def train_step(engine) -> None:
    ids = torch.randint(0, 32, (1, 8))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()


def weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def snapshot(engine) -> dict:
    opt = engine.optimizer.state_dict()
    return {"weights": weights(engine), "optimizer": copy.deepcopy(opt),
            "scheduler": dict(engine.lr_scheduler.state_dict()), "global_steps": engine.global_steps}


RUN_STATE = {"step": 2, "policy_version": 2, "data": {"epoch": 0, "index": 17},
             "reuse": [{"group_id": 3, "reward": [0.0, 1.0]}], "stats": {"acc_ema": 0.25}}


# ---------------------------------------------------------------------------------------------


@needs_deepspeed
def test_load_restores_the_weights_optimizer_and_scheduler_that_were_saved(deepspeed_dist, tmp_path):
    engine = make_engine(deepspeed_dist)
    train_step(engine)
    train_step(engine)
    saved = snapshot(engine)
    path = save_checkpoint(tmp_path, 2, engine, tiny_tokenizer(), RUN_STATE)
    assert path == checkpoint_dir(tmp_path, 2) and path.name == "step_000002"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "hf", "optimizer.pt", "state.json"]

    train_step(engine)
    train_step(engine)
    assert not torch.equal(weights(engine)["model.norm.weight"], saved["weights"]["model.norm.weight"])

    run_state = load_checkpoint(path, engine)
    assert run_state == RUN_STATE
    assert_same(snapshot(engine), saved)
    # The tie survives loading: lm_head is still the embedding matrix.
    assert engine.module.lm_head.weight is engine.module.model.embed_tokens.weight


@needs_deepspeed
def test_training_after_load_continues_exactly_as_without_the_interruption(deepspeed_dist, tmp_path):
    engine = make_engine(deepspeed_dist)
    train_step(engine)
    path = save_checkpoint(tmp_path, 1, engine, None, {"rng": rng_state()})
    train_step(engine)
    expected = weights(engine)

    fresh = make_engine(deepspeed_dist, seed=1)  # different init: everything must come from disk
    set_rng_state(load_checkpoint(path, fresh)["rng"])
    train_step(fresh)
    assert_same(weights(fresh), expected)


@needs_deepspeed
def test_the_hf_folder_loads_with_from_pretrained(deepspeed_dist, tmp_path):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    engine = make_engine(deepspeed_dist)
    path = save_checkpoint(tmp_path, 5, engine, tiny_tokenizer(), {"step": 5})
    model = AutoModelForCausalLM.from_pretrained(path / "hf")
    assert_same({k: v for k, v in model.state_dict().items()}, weights(engine))
    # (AutoTokenizer would pick Qwen2Tokenizer from config.json and re-split our toy vocabulary;
    # real Qwen tokenizers are that class anyway.)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "hf")
    assert tokenizer("t1 t2 t3")["input_ids"] == [1, 2, 3]


@needs_deepspeed
def test_a_zero_1_engine_round_trips_through_deepspeeds_own_format(deepspeed_dist, tmp_path):
    engine = make_engine(deepspeed_dist, stage=1)
    train_step(engine)
    saved_weights, saved_steps = weights(engine), engine.global_steps
    saved_lr = engine.lr_scheduler.get_last_lr()
    path = save_checkpoint(tmp_path, 1, engine, None, {"rng": rng_state()})
    assert (path / "ds").is_dir() and not (path / "optimizer.pt").exists()
    train_step(engine)
    expected = weights(engine)  # needs the saved Adam moments to reproduce
    train_step(engine)

    set_rng_state(load_checkpoint(path, engine)["rng"])
    assert_same(weights(engine), saved_weights)
    assert engine.global_steps == saved_steps
    assert engine.lr_scheduler.get_last_lr() == saved_lr
    train_step(engine)
    assert_same(weights(engine), expected)


@needs_deepspeed
def test_keep_last_prunes_older_checkpoints(deepspeed_dist, tmp_path):
    engine = make_engine(deepspeed_dist)
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, engine, None, {"step": step}, keep_last=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000003", "step_000004"]


@needs_deepspeed
def test_latest_checkpoint_skips_partial_and_corrupt_ones_with_a_warning(deepspeed_dist, tmp_path, caplog):
    engine = make_engine(deepspeed_dist)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, engine, None, {"step": step}, keep_last=None)
    (checkpoint_dir(tmp_path, 3) / "COMPLETE").unlink()  # crash before the marker
    (checkpoint_dir(tmp_path, 2) / "state.json").write_text('{"step": 2, "trunc')  # corrupt
    (tmp_path / "checkpoints" / ".tmp-step_000004").mkdir()  # crash mid-write

    with caplog.at_level(logging.WARNING, logger="learner.checkpoint"):
        assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 1)
    text = caplog.text
    assert "step_000003" in text and "COMPLETE" in text
    assert "step_000002" in text and "state.json" in text
    assert ".tmp-step_000004" in text
    with pytest.raises(CheckpointError, match="step_000002.*state.json"):
        load_checkpoint(checkpoint_dir(tmp_path, 2), engine)


def test_latest_checkpoint_of_a_run_without_checkpoints_is_none(tmp_path):
    assert latest_checkpoint(tmp_path) is None


@needs_deepspeed
def test_corrupt_weight_or_optimizer_files_raise_checkpoint_error_naming_the_file(deepspeed_dist, tmp_path):
    engine = make_engine(deepspeed_dist)
    path = save_checkpoint(tmp_path, 1, engine, None, {"step": 1})
    optimizer_pt = path / "optimizer.pt"
    good = optimizer_pt.read_bytes()
    optimizer_pt.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        load_checkpoint(path, engine)
    optimizer_pt.write_bytes(good)

    weights_file = path / "hf" / "model.safetensors"
    weights_file.write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(path, engine)


def test_a_run_state_that_is_not_json_fails_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, 1, engine=None, tokenizer=None, run_state={"x": object()})
    assert not (tmp_path / "checkpoints").exists()


def test_rng_state_is_json_and_restores_every_generator():
    state = json.loads(json.dumps(rng_state()))
    first = (random.random(), np.random.rand(), torch.rand(3).tolist(), np.random.randn())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(3).tolist(), np.random.randn()) == first
