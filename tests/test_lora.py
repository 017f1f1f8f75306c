"""LoRA on the learner (`model.lora`, learner/lora.py): only the adapter trains, the KL reference
is the base with the adapter off, the whole weights the actors and hf/ get are the policy, and a
checkpoint resumes the adapter on the base it was trained on, and no other.

The engines are real DeepSpeed engines in a child process's world (tests/ds_world.py).
Run: .venv/bin/pytest tests/test_lora.py -q
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from protocol.config import ConfigError, load_config
from tests.conftest import TINY, assert_on_policy, quick_run_args, read_rows, run_rlvr
from tests.ds_world import World

IDS = torch.tensor([[5, 9, 12, 7, 30, 4, 18, 22]])


@pytest.fixture(scope="module")
def world():
    with World() as w:
        yield w


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tasks.tiny_model import build_tiny

    return str(build_tiny(tmp_path_factory.mktemp("lora") / "base", hidden=32, layers=2,
                          heads=2, ffn=64, seed=0))


def lora_config(base: str, *overrides: str):
    return load_config(TINY, [f"model.path={base}", "model.lora.rank=4", "model.lora.alpha=8",
                              "loss.kl_beta=0.05", "optim.lr=0.01", *overrides])


def train(engine, steps: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(3, 40, (2, 10), generator=gen)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()


def logprobs(model, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)


def plain_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# -- in the DeepSpeed world -------------------------------------------------------------------

def _only_the_adapter_trains(base: str) -> None:
    from learner.engine import build_engine

    engine = build_engine(lora_config(base), base)
    named = dict(engine.module.named_parameters())
    adapter = {n for n in named if ".lora_" in n}
    stepped = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert adapter and stepped == {id(named[n]) for n in adapter}
    frozen = {n: p.detach().clone() for n, p in named.items() if n not in adapter}
    train(engine, 3)
    assert all(torch.equal(p, named[n]) for n, p in frozen.items())  # the base never moves
    assert any(named[n].abs().sum() > 0 for n in adapter if ".lora_B." in n)  # B leaves 0


def _the_reference_is_the_base(base: str) -> None:
    from learner.engine import build_engine, build_reference
    from learner.lora import reference_off

    cfg = lora_config(base)
    engine = build_engine(cfg, base)
    train(engine, 3)
    reference = build_reference(cfg, engine)
    assert reference is engine.module  # no second copy of the base
    with reference_off(reference):
        off = logprobs(reference)
    assert torch.allclose(off, logprobs(plain_model(base)), atol=1e-6)
    assert (logprobs(engine.module) - off).abs().max() > 1e-4  # the adapter was back on


def _the_merged_weights_are_the_policy(base: str) -> None:
    from learner.engine import build_engine
    from learner.lora import merged_state_dict

    engine = build_engine(lora_config(base), base)
    train(engine, 4)
    plain = plain_model(base)
    merged = merged_state_dict(engine.module)
    assert set(merged) == {n for n, _ in plain.named_parameters()}
    plain.load_state_dict(merged, strict=False)
    gap = (logprobs(plain) - logprobs(engine.module)).abs().max()
    assert gap < 1e-5, gap
    assert (logprobs(plain) - logprobs(plain_model(base))).abs().max() > 1e-4


def _a_checkpoint_resumes_on_its_own_base(base: str, run_dir: str, stage: int) -> None:
    from transformers import AutoModelForCausalLM

    from learner.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from learner.engine import build_engine
    from tasks.tiny_model import load_tokenizer

    cfg = lora_config(base, f"optim.zero_stage={stage}")
    engine = build_engine(cfg, base)
    train(engine, 3)
    folder = save_checkpoint(run_dir, 3, engine, load_tokenizer(base), {"step": 3})
    hf = plain_model(str(folder / "hf"))  # the merged weights, a plain model
    assert (logprobs(hf) - logprobs(engine.module)).abs().max() < 1e-5

    resumed = build_engine(cfg, base)
    assert load_checkpoint(folder, resumed) == {"step": 3}
    train(engine, 2, seed=1)
    train(resumed, 2, seed=1)  # the adapter and its optimizer state went on exactly
    for (name, a), (_, b) in zip(engine.module.named_parameters(),
                                 resumed.module.named_parameters()):
        assert torch.equal(a, b), name

    other = f"{run_dir}/other-base"  # model.path's weights changed since: refused, named
    shutil.copytree(base, other)
    model = AutoModelForCausalLM.from_pretrained(other)
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    model.save_pretrained(other)
    try:
        load_checkpoint(folder, build_engine(cfg, other))
        raise AssertionError("a checkpoint loaded onto another base")
    except CheckpointError as e:
        assert "adapter/base.json" in str(e), e
    plain = build_engine(load_config(TINY, [f"model.path={base}"]), base)
    try:
        load_checkpoint(folder, plain)
        raise AssertionError("a LoRA checkpoint loaded into a run without the adapter")
    except CheckpointError as e:
        assert "LoRA adapter" in str(e), e


# -- the tests --------------------------------------------------------------------------------

def test_only_the_adapter_trains_and_holds_optimizer_state(world, base):
    world.run(_only_the_adapter_trains, base)


def test_the_kl_reference_is_the_base_with_the_adapter_off(world, base):
    world.run(_the_reference_is_the_base, base)


def test_the_merged_weights_are_the_policy(world, base):
    world.run(_the_merged_weights_are_the_policy, base)


@pytest.mark.parametrize("stage", [0, 1])  # a torch optimizer's state; DeepSpeed's own format
def test_a_checkpoint_resumes_the_adapter_on_its_own_base_only(world, base, tmp_path, stage):
    world.run(_a_checkpoint_resumes_on_its_own_base, base, str(tmp_path / "run"), stage)


def test_lora_knobs_without_an_adapter_and_zero_3_are_refused_naming_the_key(base):
    with pytest.raises(ConfigError, match="'model.lora.alpha'"):
        load_config(TINY, [f"model.path={base}", "model.lora.alpha=8"])
    with pytest.raises(ConfigError, match="'model.lora.rank'.*zero_stage 3"):
        load_config(TINY, [f"model.path={base}", "model.lora.rank=4", "optim.zero_stage=3"])
    with pytest.raises(ConfigError, match="'model.lora.dropout'"):
        load_config(TINY, [f"model.path={base}", "model.lora.rank=4", "model.lora.dropout=1"])


@pytest.mark.slow
def test_a_lora_sync_run_samples_the_policy_it_trains_and_resumes(tmp_path, tiny_model):
    run = tmp_path / "lora"
    done = run_rlvr(*quick_run_args(run, tiny_model, "algorithm=grpo", "mode=sync",
                                    "run.steps=4", "run.checkpoint_every=2", "model.lora.rank=4",
                                    "model.lora.alpha=8", "optim.lr=0.01", "optim.warmup_steps=1",
                                    "loss.kl_beta=0.05"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_on_policy(train_rows(run))  # the merged weights the actor got are the policy
    base = json.loads((run / "checkpoints" / "step_000004" / "adapter" / "base.json").read_text())
    assert base["path"] == str(tiny_model)
    again = run_rlvr("train", "--resume", str(run), "run.steps=6")
    assert again.returncode == 0, again.stderr[-3000:]
    rows = train_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert_on_policy(rows[4:])
    # the KL term is against the base with the adapter off: 0 until the first step that trains
    # the adapter, above 0 at every step after it, the resumed ones too (were the reference the
    # policy: 0 throughout; were the adapter not resumed: 0 again at step 5)
    kl = [r["kl/mean"] for r in rows]
    first = next(i for i, r in enumerate(rows) if r["groups/frac_zero_adv_final"] < 1)
    assert first < 4, f"the adapter trained at no step before the resume: nothing to check {kl}"
    assert all(k == 0 for k in kl[:first + 1]) and all(k > 0 for k in kl[first + 1:]), kl
    # exported as a PEFT adapter on its base, and merged: both are the policy the run trained
    for how in ([], ["--merge"]):
        done = run_rlvr("export", str(run), str(tmp_path / f"export{how}"), *how)
        assert done.returncode == 0, done.stderr[-3000:]
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(plain_model(str(tiny_model)), tmp_path / "export[]")
    merged = plain_model(str(tmp_path / "export['--merge']"))
    trained = logprobs(plain_model(str(run / "checkpoints" / "step_000006" / "hf")))
    assert not torch.allclose(logprobs(plain_model(str(tiny_model))), trained, atol=1e-4)
    for model in (adapted, merged):
        torch.testing.assert_close(logprobs(model), trained, atol=1e-5, rtol=0)
    broken = tmp_path / "broken"  # a checkpoint whose adapter lost its base.json
    shutil.copytree(run, broken)
    (broken / "checkpoints" / "step_000006" / "adapter" / "base.json").unlink()
    done = run_rlvr("export", str(broken), str(tmp_path / "from-broken"))
    assert done.returncode == 2 and "base.json" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "from-broken").exists()


def train_rows(run) -> list[dict]:
    return [r for r in read_rows(run) if r["step"] > 0]
