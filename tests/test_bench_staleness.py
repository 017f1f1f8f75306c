"""`rlvr bench staleness` (rlvr/bench/staleness.py): cells of final accuracy against injected
staleness per objective, the drop from K = 0, the tolerance read off the curve, and the one K = 0
run per seed that the objectives share where their updates coincide on-policy."""

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

from learner.batch import pack
from learner.logprobs import token_logp
from learner.update import LossRow, UpdateSpec, policy_update
from protocol.config import load_config
from rlvr.bench import staleness
from rlvr.bench.staleness import OBJECTIVES, reduce_cells, report, shared_on_policy, tolerance
from rlvr.cli import main
from tasks.tiny_model import build_model, build_tokenizer
from tests.sgd_engine import SGDEngine


def rows(final_avg, clip=0.01, stale=None):
    """Metric rows of a finished run: step 0 (eval before RL), two training steps, the last
    with the final evaluation."""
    return [{"step": 0, "eval/avg@8": 0.4, "eval/pass@8": 0.6},
            {"step": 1, "pg/clip_frac": 0.0, "stale/mean": stale, "is/w_mean": 1.0},
            {"step": 2, "pg/clip_frac": clip, "stale/mean": stale, "is/w_mean": 0.9,
             "eval/avg@8": final_avg, "eval/pass@8": final_avg + 0.2}]


def test_cells_average_the_final_evaluation_over_seeds_and_measure_the_drop_from_k_0():
    runs = [("naive", 0, 0, rows(0.60)), ("naive", 0, 1, rows(0.62)),
            ("naive", 16, 0, rows(0.55, clip=0.2, stale=16)),
            ("naive", 16, 1, rows(0.57, clip=0.4, stale=16)),
            ("m2po", 16, 0, rows(0.60)), ("m2po", 0, 0, rows(0.61))]
    cells = reduce_cells(runs)
    assert list(cells["naive"]) == [0, 16] and list(cells["m2po"]) == [0, 16]
    assert cells["naive"][0]["eval/avg@8"]["mean"] == pytest.approx(0.61)
    assert cells["naive"][0]["eval/avg@8"]["std"] == pytest.approx(0.0141421, abs=1e-6)
    assert cells["naive"][16]["drop_points"] == pytest.approx(5.0)
    assert cells["m2po"][16]["drop_points"] == pytest.approx(1.0)
    assert cells["m2po"][16]["eval/avg@8"]["std"] is None  # one seed: no spread
    # training means over the training rows of each run, then over seeds
    assert cells["naive"][16]["pg/clip_frac"] == pytest.approx((0.1 + 0.2) / 2)
    assert cells["naive"][16]["stale/mean"] == 16 and cells["naive"][0]["stale/mean"] is None
    assert cells["naive"][16]["eval/pass@8"]["mean"] == pytest.approx(0.76)
    text = report({"config": "c.yaml", "overrides": ["mode=sync"], "cells": cells})
    assert "| naive | 16 | 2 | 0.560 ± 0.014 | 0.550 0.570 | 5.0 |" in text
    assert "- naive: K = 0" in text and "- m2po: K = 16" in text


def test_the_report_shows_each_seeds_final_accuracy_so_that_a_collapse_is_seen():
    # the runs arrive in any order; a seed whose run has no final evaluation shows as "-"
    runs = [("decoupled", 4, 2, rows(0.0)), ("decoupled", 4, 0, rows(0.58)),
            ("decoupled", 4, 1, rows(0.56)), ("decoupled", 4, 3, [{"step": 1}]),
            ("decoupled", 0, 0, rows(0.6))]
    cells = reduce_cells(runs)
    avg = cells["decoupled"][4]["eval/avg@8"]
    assert cells["decoupled"][4]["seeds"] == [0, 1, 2, 3]
    assert avg["by_seed"] == {"0": 0.58, "1": 0.56, "2": 0.0} and avg["n"] == 3
    assert avg["values"] == [0.58, 0.56, 0.0]
    text = report({"config": "c.yaml", "overrides": [], "cells": cells})
    assert "| decoupled | 4 | 4 | 0.380 ± 0.329 | 0.580 0.560 0.000 - |" in text
    # results.json keeps it: a report of the cells read back is the same
    assert report(json.loads(json.dumps({"config": "c.yaml", "overrides": [],
                                         "cells": cells}))).count("0.580 0.560 0.000 -") == 1


def test_tolerance_is_the_last_k_before_the_first_drop_over_the_threshold():
    by_k = {0: {"drop_points": 0.0}, 4: {"drop_points": 1.5}, 16: {"drop_points": 2.5},
            64: {"drop_points": 1.0}}  # a later K back within 2 points does not count
    assert tolerance(by_k) == 4
    assert tolerance(by_k, points=3.0) == 64


@pytest.mark.parametrize("flags,message", [
    (["--objectives", "ppo"], "--objectives: unknown ['ppo']"),
    (["--inject", "0,-4"], "--inject: staleness values >= 0"),
    (["--seeds", "0"], "--seeds must be >= 1"),
])
def test_bad_arguments_are_refused_before_any_run_starts(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "staleness", "configs/tiny-cpu.yaml", "--out", str(tmp_path), *flags])
    assert message in str(e.value)
    assert not any(tmp_path.iterdir())


def test_every_objective_is_a_config_the_loader_accepts():
    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny-cpu.yaml"
    for name, overrides in OBJECTIVES.items():
        cfg = load_config(tiny, ["mode=sync", "max_staleness=0", *overrides, "stale_inject=4"])
        assert cfg.stale_inject == 4, name


def _step_under(objective: str, behaviour_shift: float, mini_batches: int = 1,
                lr: float = 2.0) -> list:
    """The tiny model's parameters after one learner step under `objective`'s loss keys, on rows
    whose behaviour log-probs are the model's own shifted by `behaviour_shift` (0: on-policy)."""
    torch.manual_seed(0)
    model = build_model(build_tokenizer(), hidden=32, layers=1, heads=2, ffn=64).eval()
    cfg = load_config("configs/tiny-cpu.yaml", ["mode=sync", "max_staleness=0",
                                                f"optim.mini_batches={mini_batches}",
                                                f"optim.lr={lr}", "optim.warmup_steps=0",
                                                *OBJECTIVES[objective]], refuse_inert=False)
    rows = []
    for i, (response, adv) in enumerate([([5, 6, 7], 1.5), ([8, 9], -0.5), ([5, 9, 9, 7], -1.0),
                                         ([6], 0.8)]):
        packed = pack([LossRow([3, 4], response, [0.0] * len(response), 0.0, 0)], 0)
        with torch.no_grad():
            logp = token_logp(model, packed)[0][0][packed.mask[0] != 0]
        rows.append(LossRow([3, 4], response, (logp + behaviour_shift).tolist(), adv, 0,
                            group_id=f"g{i}"))  # groups: what mini-batches split
    spec = UpdateSpec.of(cfg)
    engine = SGDEngine(copy.deepcopy(model), lr)  # the update sets the rate: optim.lr
    policy_update(engine, rows, spec, 0)
    return [p.detach().clone() for p in engine.module.parameters()]


def _same(a: list, b: list) -> bool:
    return all(torch.allclose(x, y, atol=1e-6, rtol=0) for x, y in zip(a, b))


def test_on_policy_with_one_optimizer_step_every_objective_takes_the_same_step():
    """Why the curve runs K = 0 once per seed and shares it (`shared_on_policy`): on data the
    current weights sampled, one optimizer step is the same under all four objectives; off-policy,
    or with several optimizer steps a learner step, they differ."""
    reference = _step_under("decoupled", 0.0)
    for objective in OBJECTIVES:
        assert _same(_step_under(objective, 0.0), reference), objective
    stale = {o: _step_under(o, -0.7) for o in OBJECTIVES}  # behaviour ratio e^0.7 ~ 2
    assert not _same(stale["naive"], stale["decoupled"])
    assert not _same(stale["m2po"], stale["mugrpo"])
    assert not _same(_step_under("mugrpo", 0.0, mini_batches=2),
                     _step_under("naive", 0.0, mini_batches=2))


@pytest.mark.parametrize("overrides,reason", [
    ([], None),
    (["mode=async"], "mode"),
    (["optim.mini_batches=2"], "optim.mini_batches"),
    (["optim.epochs=2"], "optim.epochs"),
    (["ar3po.reuse_mode=direct_replay"], "ar3po.reuse_mode"),
])
def test_k0_is_shared_only_where_the_objectives_coincide_on_policy(overrides, reason):
    cfg = load_config("configs/tiny-cpu.yaml", ["mode=sync", "max_staleness=0", *overrides],
                      refuse_inert=False)
    why_not = shared_on_policy(cfg)
    assert why_not is None if reason is None else reason in why_not


def _fake_sweep(calls):
    """`sweep` standing in for real runs: records (objective folder, K axis) and writes each
    run's config and a last metrics row whose final accuracy encodes who ran it."""
    def sweep(config, overrides, folder, axis_keys=()):
        seed = int(next(o for o in overrides if o.startswith("run.seed=")).split("=")[1])
        ks = next(o for o in overrides if o.startswith("stale_inject=")).split("=")[1]
        calls.append((folder.parent.name, ks))
        for k in ks.split(","):
            d = folder / "runs" / f"stale_inject_{k}-s{seed}"
            d.mkdir(parents=True)
            (d / "config.yaml").write_text(yaml.safe_dump({"stale_inject": int(k),
                                                           "run": {"seed": seed}}))
            final = 0.5 - int(k) / 100 + (0.01 if folder.parent.name == "naive" else 0.0)
            (d / "metrics.jsonl").write_text(json.dumps(
                {"step": 3, "eval/avg@8": final, "eval/pass@8": final}) + "\n")
        return {}
    return sweep


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_curve_runs_k0_once_and_shares_it_only_where_the_objectives_coincide(
        mode, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(staleness, "sweep", _fake_sweep(calls))
    results = staleness.run("configs/tiny-cpu.yaml", tmp_path, [f"mode={mode}",
                            "model.path=/nonexistent"], 3, [0, 4], ["naive", "decoupled"], 2)
    cells = results["cells"]
    if mode == "sync":
        assert calls == [("naive", "0,4"), ("decoupled", "4")] * 2
        assert cells["decoupled"][0]["eval/avg@8"]["values"] == [0.51, 0.51]  # naive's runs
        assert "naive's, shared by every objective" in (tmp_path / "staleness.md").read_text()
    else:  # the run's own lag makes K = 0 off-policy: each objective runs it
        assert calls == [("naive", "0,4"), ("decoupled", "0,4")] * 2
        assert cells["decoupled"][0]["eval/avg@8"]["values"] == [0.5, 0.5]
        assert "run per objective (mode async" in (tmp_path / "staleness.md").read_text()
    assert cells["decoupled"][4]["drop_points"] == pytest.approx(5.0 if mode == "sync" else 4.0)


def test_an_earlier_curve_with_k0_per_objective_is_extended_as_it_was(tmp_path, monkeypatch):
    old = tmp_path / "decoupled" / "seed0"
    old.mkdir(parents=True)  # a plan from before K = 0 was shared: its own K = 0 run
    (old / "sweep.json").write_text(json.dumps({"runs": [
        {"name": "stale_inject_0-s0", "overrides": ["mode=sync", "stale_inject=0"]}]}))
    calls = []
    monkeypatch.setattr(staleness, "sweep", _fake_sweep(calls))
    results = staleness.run("configs/tiny-cpu.yaml", tmp_path, ["mode=sync",
                            "model.path=/nonexistent"], 3, [0, 4], ["naive", "decoupled"], 1)
    assert calls == [("naive", "0,4"), ("decoupled", "0,4")]
    assert results["cells"]["decoupled"][0]["eval/avg@8"]["values"] == [0.5]  # its own


def test_a_curve_begun_at_one_k_takes_more_ks_later_reusing_its_run(tmp_path, monkeypatch):
    """The real sweep, with training stood in for: `--inject 4` and then `--inject 4,16` in the
    same folder train K = 4 once and K = 16 once; one K was once a sweep with no axis, whose run
    (`base`) no later plan contained, so the second command was refused."""
    trained = []

    def train(config, overrides, resume_dir, dry_run):
        opts = dict(o.split("=", 1) for o in overrides)
        run_dir = Path(opts["run.out_dir"]) / opts["run.name"]
        trained.append(run_dir.name)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(
            {"stale_inject": int(opts["stale_inject"]), "run": {"seed": int(opts["run.seed"])}}))
        final = 0.5 - int(opts["stale_inject"]) / 100
        (run_dir / "metrics.jsonl").write_text(json.dumps(
            {"step": int(opts["run.steps"]), "eval/avg@8": final, "eval/pass@8": final}) + "\n")
        (run_dir / "summary.json").write_text("{}")
        return 0

    monkeypatch.setattr("rlvr.launch.train", train)
    args = ("configs/tiny-cpu.yaml", tmp_path, ["mode=sync", "model.path=/nonexistent"], 3)
    staleness.run(*args, [4], ["decoupled"], 1)
    (tmp_path / "decoupled" / "seed0" / "runs" / "stale_inject-4" / "summary.json").write_text(
        json.dumps({"code": {"commit": "a" * 40, "dirty": False}}))  # made by another code
    results = staleness.run(*args, [4, 16], ["decoupled"], 1)
    assert trained == ["stale_inject-4", "stale_inject-16"]
    cells = results["cells"]["decoupled"]
    assert cells[4]["eval/avg@8"]["values"] == [0.46]
    assert cells[16]["eval/avg@8"]["values"] == [pytest.approx(0.34)]
    # without a K = 0 run the drop is from K = 4, and the report says so
    assert "decoupled: K = 4 (drop measured from K = 4: the curve has no K = 0)" in \
        (tmp_path / "staleness.md").read_text()
    assert results["codes"] == {"aaaaaaa": 1, "unknown": 1}  # the stand-in records no code
    assert "Runs made by code: aaaaaaa (1 run), unknown (1 run); the cells may differ by more " \
        "than staleness" in (tmp_path / "staleness.md").read_text()
