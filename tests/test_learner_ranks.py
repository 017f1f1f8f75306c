"""Data-parallel learner ranks take the same step as one rank: real DeepSpeed engines over gloo,
in spawned processes, on the tiny model."""

from __future__ import annotations

import multiprocessing as mp
import random
from pathlib import Path

import pytest
import torch

from learner.ranks import decode_plan, encode_plan
from learner.update import ContrastGroup, LossRow
from rlvr.launch import free_port
from tests.conftest import TINY


def make_rows(n_active: int, n_zero: int, seed: int = 0) -> list[LossRow]:
    rng = random.Random(seed)
    rows = []
    for i in range(n_active + n_zero):
        prompt = [rng.randrange(5, 60) for _ in range(rng.randrange(3, 7))]
        response = [rng.randrange(5, 60) for _ in range(rng.randrange(1, 6))]
        adv = rng.choice([-1.0, -0.5, 0.5, 1.0]) if i < n_active else 0.0
        rows.append(LossRow(prompt, response, [-rng.uniform(0.5, 3.0) for _ in response], adv,
                            policy_version=0, group_id=f"g{i}"))
    return rows


ROW_SETS = [5, 1]  # active rows per step; 5: uneven shares, 1: rank 1 has no row at all
MINI_BATCHES = [1, 2]  # optimizer steps per learner step: each row set is trained both ways


def one_step(rank: int, world: int, port: int, model: str, out: str, zero_stage: int) -> None:
    """Child: build the engine of rank `rank` of `world` (ZeRO stage `zero_stage`), take a step
    on each row set (lr 0, so the weights stay put and every step sees the same model) and save
    the reduced gradients (just before the optimizer uses them; none under ZeRO-2, which keeps
    them partitioned outside p.grad) and the metrics."""
    import os
    from dataclasses import replace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from learner.engine import build_engine, init_learner_distributed
    from learner.ranks import train_step
    from protocol.config import load_config

    # lr 0 is refused in a user's config (it trains nothing); here it keeps the weights put
    cfgs = [load_config(TINY, [f"model.path={model}", "learner.micro_batch=2",
                               "optim.warmup_steps=1", f"optim.mini_batches={mb}",
                               f"optim.zero_stage={zero_stage}"])
            for mb in MINI_BATCHES]
    cfgs = [replace(c, optim=replace(c.optim, lr=0.0)) for c in cfgs]
    cfg = cfgs[0]
    init_learner_distributed(cfg, rank, world)
    engine = build_engine(cfg, model)
    grads: list[dict] = []
    step = engine.step

    def capture_then_step():
        if engine.is_gradient_accumulation_boundary() and zero_stage == 0:
            grads.append({n: p.grad.detach().clone()
                          for n, p in engine.module.named_parameters() if p.grad is not None})
        step()

    engine.step = capture_then_step
    metrics = [train_step(engine, c, 0, make_rows(n, n_zero=3, seed=n), [])
               for c in cfgs for n in ROW_SETS]
    if rank == 0:
        torch.save({"grads": grads, "metrics": metrics}, out)
    torch.distributed.destroy_process_group()


def run_ranks(world: int, model: Path, out: Path, zero_stage: int = 0, target=one_step) -> dict:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, str(model), str(out), zero_stage))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * world
    return torch.load(out, weights_only=False)


def test_two_ranks_reduce_the_same_gradient_and_metrics_as_one(tiny_model, tmp_path):
    one = run_ranks(1, tiny_model, tmp_path / "one.pt")
    two = run_ranks(2, tiny_model, tmp_path / "two.pt")
    # one optimizer step per row set, then two per row set (the second mini-batch of the set
    # with one active row has no gradient and takes no step): 2 + 3 boundaries
    assert len(one["grads"]) == len(two["grads"]) == 5
    for g1, g2 in zip(one["grads"], two["grads"]):
        assert g1.keys() == g2.keys() and g1
        for name, g in g1.items():
            # float32 sums in another order (two ranks' halves, then the all-reduce) differ by
            # a few ulps of the largest terms: measured up to 2.4e-7 on an embedding gradient
            # (largest entries per step 1e-4 to 0.4); a wrong reduction (a rank missing, a sum
            # for a mean) is off by the gradient itself
            torch.testing.assert_close(g2[name], g, rtol=1e-4, atol=1e-4 * g.abs().max().item(),
                                       msg=lambda m, name=name: f"{name}: {m}")
    for n_active, m1, m2 in zip(ROW_SETS * 2, one["metrics"], two["metrics"]):
        for key in ("loss", "pg/clip_frac", "is/w_mean", "policy/entropy", "grad_norm"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-7), key
        assert m2["train/rows_forward"] == m1["train/rows_forward"] == n_active
        assert m2["train/optimizer_steps"] == m1["train/optimizer_steps"]
    assert [m["train/optimizer_steps"] for m in one["metrics"]] == [1, 1, 2, 1]
    # ZeRO-2 keeps each rank's gradient partition outside p.grad: the norm is the optimizer's
    # global one, the same as one rank's whole gradient (a norm of p.grad was 0 here)
    zero2 = run_ranks(2, tiny_model, tmp_path / "zero2.pt", zero_stage=2)
    for m1, m2 in zip(one["metrics"], zero2["metrics"]):
        assert m1["grad_norm"] > 0
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4), "grad_norm"
        assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-4, abs=1e-7)


def lr_steps(rank: int, world: int, port: int, model: str, out: str, zero_stage: int) -> None:
    """Child: learner steps 0..4 with warm-up over 4 steps, where step 1 and the second
    mini-batch of every step carry no gradient (all-zero advantages: no optimizer step); saves
    each step's logged optim/lr and the rate the optimizer held after it."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    torch.set_num_threads(1)
    from learner.engine import build_engine, init_learner_distributed
    from learner.ranks import train_step
    from protocol.config import load_config

    cfg = load_config(TINY, [f"model.path={model}", "optim.lr=0.001", "optim.warmup_steps=4",
                             "optim.mini_batches=2", f"optim.zero_stage={zero_stage}"])
    init_learner_distributed(cfg, 0, 1)
    engine = build_engine(cfg, model)
    logged, held = [], []
    for step in range(5):
        rows = make_rows(0 if step == 1 else 1, n_zero=3, seed=step)
        logged.append(train_step(engine, cfg, 0, rows, [], step=step)["optim/lr"])
        held.append(engine.get_lr()[0])
    torch.save({"logged": logged, "held": held}, out)
    torch.distributed.destroy_process_group()


def test_the_learning_rate_follows_the_learner_step_through_steps_that_train_nothing(
        tiny_model, tmp_path):
    got = run_ranks(1, tiny_model, tmp_path / "lr.pt", target=lr_steps)
    schedule = [0.001 * min(1.0, (s + 1) / 4) for s in range(5)]  # optim.warmup_steps 4
    assert got["logged"] == pytest.approx(schedule)
    assert got["held"] == pytest.approx(schedule)  # what the optimizer stepped with


def test_a_plan_survives_the_wire_exactly_and_without_pickle():
    rows = make_rows(3, 1)
    contrasts = [ContrastGroup([1, 2], [3, 4, 0], [[5], [6, 7]])]
    data = encode_plan("train", rows=rows, contrasts=contrasts)
    assert b"\x80\x04" not in data[:2]  # not a pickle stream: msgpack map
    plan = decode_plan(data)
    assert plan["kind"] == "train" and plan["rows"] == rows and plan["contrasts"] == contrasts
    assert decode_plan(encode_plan("checkpoint", step=7)) == {"kind": "checkpoint", "step": 7}


@pytest.mark.slow
def test_a_run_with_two_learner_ranks_trains_checkpoints_and_resumes(tiny_model, tmp_path):
    from tests.conftest import assert_on_policy, quick_run_args, read_rows, run_rlvr

    run = tmp_path / "ranks"
    first = run_rlvr(*quick_run_args(run, tiny_model, "learner.ranks=2", "mode=sync",
                                     "algorithm=grpo", "run.steps=3", "run.checkpoint_every=2",
                                     "run.eval_every=100"), timeout_s=400)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["learner/ranks"] == 2 for r in rows[1:])
    # the actor samples with rank 0's weights, which both ranks stepped identically: the
    # behaviour log-probs still match the learner's forward
    assert_on_policy(rows[1:])
    assert "stop" in (run / "logs" / "learner-1.log").read_text()  # rank 1 was told to end
    again = run_rlvr("train", "--resume", str(run), "run.steps=5", timeout_s=400)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["step"] for r in read_rows(run)] == [0, 1, 2, 3, 4, 5]


def test_gradient_checkpointing_recomputes_the_same_gradient(tiny_model):
    from learner.engine import policy_model
    from protocol.config import load_config

    ids = torch.tensor([[3, 9, 14, 27, 8, 5, 11, 2]])
    grads = {}
    for on in (False, True):
        cfg = load_config(TINY, [f"model.path={tiny_model}",
                                 f"learner.grad_checkpointing={str(on).lower()}"])
        model = policy_model(cfg, str(tiny_model)).train()
        assert model.is_gradient_checkpointing == on
        model(input_ids=ids, labels=ids).loss.backward()
        grads[on] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for a, b in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
