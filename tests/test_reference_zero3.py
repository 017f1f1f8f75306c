"""The KL reference under ZeRO-3 (learner/engine.py build_reference): an inference-only ZeRO-3
engine whose parameters stay partitioned, giving the initial model's log-probs; the policy, a
ZeRO-3 training engine, starts at KL 0 and moves away. Real DeepSpeed on CPU over gloo, in a
spawned process."""

from __future__ import annotations

import multiprocessing as mp
import os
import random

import pytest

from rlvr.launch import free_port

pytestmark = pytest.mark.deepspeed


def child(model_path: str, port: int, results) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM

        from learner.batch import pack
        from learner.engine import build_engine, build_reference, init_learner_distributed
        from learner.logprobs import token_logp
        from learner.update import LossRow, UpdateSpec, policy_update
        from protocol.config import load_config
        from tests.conftest import TINY

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                          LOCAL_RANK="0", WORLD_SIZE="1")
        torch.set_num_threads(1)
        cfg = load_config(TINY, [f"model.path={model_path}", "optim.zero_stage=3",
                                 "loss.kl_beta=0.05", "optim.lr=2e-3", "rollout.temperature=0.7"])
        init_learner_distributed(cfg, 0, 1)
        engine = build_engine(cfg, model_path)
        reference = build_reference(cfg)
        rng = random.Random(0)
        rows = [LossRow([rng.randrange(5, 60) for _ in range(5)],
                        [rng.randrange(5, 60) for _ in range(4)], [-2.0] * 4,
                        rng.choice([-1.0, 1.0]), 0, group_id=f"g{i // 4}") for i in range(16)]
        with torch.no_grad():
            got, _ = token_logp(reference, pack(rows, 0), 0.7)
            want, _ = token_logp(AutoModelForCausalLM.from_pretrained(model_path),
                                 pack(rows, 0), 0.7)
        kl = [policy_update(engine, rows, UpdateSpec.of(cfg), 0, (), reference)["kl/mean"]
              for _ in range(2)]
        results.put({"partitioned": all(p.numel() == 0 for p in reference.parameters()),
                     "gap": float((got - want).abs().max()), "kl": kl})
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put({"error": repr(e)})


def test_a_zero3_reference_stays_partitioned_and_gives_the_initial_model_s_logprobs(
        tiny_model):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=child, args=(str(tiny_model), free_port(), results))
    proc.start()
    out = results.get(timeout=300)
    proc.join(60)
    assert "error" not in out, out["error"] if "error" in out else ""
    assert out["partitioned"]  # no rank holds the whole reference outside its forward
    assert out["gap"] < 1e-5
    assert out["kl"][0] == pytest.approx(0.0, abs=1e-7) and out["kl"][1] > 1e-4
