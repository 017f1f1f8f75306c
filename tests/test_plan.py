"""`rlvr plan`: what it takes from a run folder (rlvr/plan/measure.py, model.py) and what it
recommends (report.py), on a synthetic sync run whose costs are known.

Run: .venv/bin/pytest tests/test_plan.py -q
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from protocol.config import load_config, write_resolved
from rlvr.plan.measure import measure
from rlvr.plan.model import ItemRecord, features, fit_generation, nnls
from rlvr.plan.report import plan, recommend, report
from tests.conftest import TINY, run_rlvr

COSTS = (0.004, 0.01, 0.002, 0.0001, 0.0002)  # per item, call, step of max length, token, resp
UPDATE, BROADCAST, REST, GAP = 0.08, 0.005, 0.02, 0.003


def synthetic_item(rng: random.Random) -> tuple[float, list]:
    """An AR3PO item of 8 prompts, stages of 4: prompts without a correct response go on."""
    stages, active = [], 8
    for stage in range(2):
        if stage:
            active = sum(rng.random() < 0.4 for _ in range(active))
        if not active:
            break
        lengths = [rng.randint(3, 8) for _ in range(4 * active)]
        stages.append([active, 4 * active, max(lengths), sum(lengths)])
    return float(np.dot(COSTS, features(stages))), stages


def write_sync_run(run_dir, steps: int = 60, seed: int = 0):
    cfg = load_config(TINY, ["mode=sync", f"run.steps={steps}", "model.path=/nonexistent"])
    write_resolved(cfg, run_dir)
    rng = random.Random(seed)
    rows = [{"step": 0, "time_s": 0.0}]
    for step in range(1, steps + 1):
        items = [synthetic_item(rng) for _ in range(4)]
        idle = sum(s for s, _ in items) + 4 * GAP
        tokens = 600 + rng.randint(-50, 50)
        update = UPDATE + 0.0001 * (tokens - 600)
        rows.append({"step": step, "time_s": step * 0.3, "perf/learner_idle_s": idle,
                     "timing/update": update, "perf/train_tokens_per_s": tokens / update,
                     "timing/sync": BROADCAST, "perf/step_time": idle + update + BROADCAST + REST,
                     "gen/work_items": [[s, 8, st] for s, st in items],
                     "resp/len_q": [3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5, 8],
                     "perf/actor_gen_s": sum(s for s, _ in items), "stale/max": 0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_nnls_recovers_non_negative_coefficients():
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 5, (40, 5))
    x = np.array([0.5, 0.0, 2.0, 0.0, 1.0])
    assert np.allclose(nnls(a, a @ x), x, atol=1e-9)
    # a negative least-squares coefficient is clipped to its best non-negative support
    assert (nnls(a, a @ np.array([1.0, -1.0, 0, 0, 0])) >= 0).all()


def test_the_generation_model_reproduces_the_runs_items():
    rng = random.Random(1)
    items = [synthetic_item(rng) for _ in range(300)]
    records = [ItemRecord(s, 8, tuple(tuple(x) for x in st)) for s, st in items]
    model = fit_generation(records, [[3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5, 8]], [50.0], 8)
    assert model.stay_rate[0] == 1.0 and model.stay_rate[1] == pytest.approx(0.4, abs=0.05)
    assert model.responses_per_active == (4.0, 4.0)
    assert model.scale == pytest.approx(1.0, abs=0.05)  # the linear form fits these items
    measured = np.mean([s for s, _ in items])
    assert model.mean_item_s(8) == pytest.approx(measured, rel=0.01)
    with pytest.raises(ValueError, match="too few"):
        fit_generation(records[:3], [[1] * 11], [1.0], 8)


def test_measure_reads_the_learner_and_generation_costs_of_a_sync_run(tmp_path):
    m = measure(write_sync_run(tmp_path / "run"))
    assert (m.mode, m.max_staleness, m.actors, m.notes) == ("sync", 0, 1, [])
    assert m.learner.update_s == pytest.approx(UPDATE, rel=0.02)
    assert m.learner.update_s_per_token == pytest.approx(0.0001, rel=0.05)
    assert m.learner.broadcast_s == pytest.approx(BROADCAST)
    assert m.learner.fixed_s == pytest.approx(REST)
    assert m.generation.gap_s == pytest.approx(GAP)
    assert (m.workload.prompts_per_step, m.workload.prompts_per_work) == (32, 8)


def test_plan_predicts_the_run_itself_and_recommends_a_split_per_budget(tmp_path):
    run = write_sync_run(tmp_path / "run")
    result = plan(run, actors=[1, 2, 4], ranks=[1], staleness=[0, 2], steps=200, seeds=2)
    rows = {(r["actors"], r["max_staleness"]): r for r in result["rows"]}
    g, t = result["costs"]["G_s"], result["costs"]["T_s"]
    # the run's own split in sync: a step is G then T
    assert rows[(1, 0)]["steps_per_min"] == pytest.approx(60 / (g + t), rel=0.03)
    assert rows[(2, 2)]["steps_per_min"] > rows[(1, 2)]["steps_per_min"] > rows[(1, 0)][
        "steps_per_min"]
    assert all(r["stale_max"] <= r["max_staleness"] for r in result["rows"])
    assert all(r["steps_per_min"] <= r["bound_steps_per_min"] * 1.02 for r in result["rows"])
    best = result["recommended"]
    assert set(best) == {2, 3, 5} and best[5]["actors"] == 4
    text = report(result)
    assert "recommended split per GPU budget" in text and "| 4 | 1 | async S=2 |" in text


def test_recommend_prefers_less_staleness_among_equals():
    rows = [{"actors": 2, "learner_ranks": 1, "max_staleness": 4, "steps_per_min": 100.0},
            {"actors": 2, "learner_ranks": 1, "max_staleness": 1, "steps_per_min": 99.0},
            {"actors": 1, "learner_ranks": 1, "max_staleness": 0, "steps_per_min": 50.0}]
    assert recommend(rows)[3]["max_staleness"] == 1
    assert recommend(rows)[2]["actors"] == 1
    assert recommend(rows, gpus=2) == {2: rows[2]}


def test_a_run_without_work_item_records_is_refused_with_the_reason(tmp_path):
    run = write_sync_run(tmp_path / "run")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("gen/work_items", None)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="gen/work_items"):
        measure(run)


def test_rlvr_plan_prints_the_table_and_writes_plan_json(tmp_path):
    run = write_sync_run(tmp_path / "run")
    done = run_rlvr("plan", str(run), "--actors", "1,2", "--learner-ranks", "1",
                    "--max-staleness", "0,1", "--steps", "60", "--seeds", "1",
                    "--shared-cores", "2", "--slowdown", "1.3,1.5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| actors | learner ranks | schedule | steps/min |" in done.stdout
    assert "share 2 cores" in done.stdout
    saved = json.loads((run / "plan" / "plan.json").read_text())
    assert len(saved["rows"]) == 4 and saved["machine"]["learner_slowdown"] == 1.5
    bad = run_rlvr("plan", str(run), "--actors", "0")
    assert bad.returncode != 0 and "--actors" in bad.stderr
