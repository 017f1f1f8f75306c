"""A ZeRO-3 learner (a real DeepSpeed engine on CPU over gloo) broadcasts its sharded parameters,
gathered bucket by bucket, to an actor process whose model then equals the learner's."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from rlvr.launch import free_port

pytestmark = pytest.mark.deepspeed


def tiny_model(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        vocab_size=48, tie_word_embeddings=True))


def learner(port: int, master_port: int, reference: str, errors) -> None:
    try:
        import deepspeed

        from learner.engine import publish_weights
        from protocol.weights import WeightGroup

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK="0",
                          LOCAL_RANK="0", WORLD_SIZE="1")
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo")
        model = tiny_model(seed=7)
        torch.save(model.state_dict(), reference)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config={
            "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
        assert engine.zero_optimization_stage() == 3
        assert any(p.numel() == 0 for p in engine.module.parameters())  # really sharded
        group = WeightGroup.create("127.0.0.1", port, 0, 2, timeout_s=30)
        publish_weights(engine, group, bucket_bytes=4096)  # many small buckets
        group.close()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        errors.put(f"learner: {e!r}")


def test_zero3_parameters_are_gathered_per_bucket_and_arrive_whole(tmp_path):
    from protocol.weights import WeightGroup

    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    port, reference = free_port(), str(tmp_path / "reference.pt")
    proc = ctx.Process(target=learner, args=(port, free_port(), reference, errors))
    proc.start()
    try:
        actor_model = tiny_model(seed=99)  # different weights until the broadcast lands
        group = WeightGroup.create("127.0.0.1", port, 1, 2, timeout_s=60)
        group.receive(actor_model.named_parameters(), bucket_bytes=4096)
        group.close()
    finally:
        proc.join(60)
    assert errors.empty(), errors.get()
    assert proc.exitcode == 0
    expected = torch.load(reference, weights_only=True)
    for name, param in actor_model.named_parameters():
        assert torch.equal(param, expected[name]), name
