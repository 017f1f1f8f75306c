"""What `rlvr plan` takes from a run folder: the measured costs the simulator is driven by.

From RUN_DIR/config.yaml the step's shape (prompts per step and per work item, sync_every, the
run's own split) and from RUN_DIR/metrics.jsonl, over the steady window (the first tenth of the
steps and the last step left out, as `rlvr bench throughput` does):
  - generation: every complete work item (`gen/work_items`: actor seconds, per engine call the
    prompts, responses, longest response and tokens) and the response-length deciles
    (`resp/len_q`), fitted into rlvr/plan/model.py's GenerationModel;
  - the actor's time per item outside sampling (messages, encoding): in a sync run with one
    actor the learner's wait for a step (`perf/learner_idle_s`) is the step's items back to back
    plus that gap;
  - the learner: update seconds (`timing/update`) against trained tokens (`perf/train_tokens_per_s`
    x `timing/update`), the weight broadcast (`timing/sync`; in a sync run the actors are idle,
    so it is the broadcast alone), and the rest of a step (step time - wait - update - sync -
    evaluation): bookkeeping.
Only a sync run measures generation and the learner apart; an async run's sync time includes
waiting for the actor's item in progress, and its waits overlap generation. `measure` says so
in `notes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from learner.run_log import read_metrics
from rlvr.bench.reduce import is_number, run_throughput, steady_window, step_train_tokens
from rlvr.plan.model import GenerationModel, ItemRecord, fit_generation
from rlvr.plan.sim import LearnerCosts, Workload


@dataclass
class Measurements:
    run_dir: str
    mode: str
    max_staleness: int
    actors: int
    learner_ranks: int
    algorithm: str
    workload: Workload
    learner: LearnerCosts
    generation: GenerationModel
    item_s_mean: float
    items: int
    measured: dict
    """The run's own throughput numbers (rlvr/bench/reduce.py run_throughput)."""
    notes: list[str] = field(default_factory=list)


def _mean(xs) -> float:
    xs = [x for x in xs if is_number(x)]
    return float(np.mean(xs)) if xs else math.nan


def item_records(rows: list[dict]) -> list[ItemRecord]:
    return [ItemRecord(float(rec[0]), int(rec[1]), tuple(tuple(int(v) for v in st)
                                                         for st in rec[2]))
            for r in rows for rec in (r.get("gen/work_items") or [])]


def measure(run_dir: str | Path, skip_first: int | None = None) -> Measurements:
    from protocol.config import load_config

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ValueError(f"{run_dir}: no config.yaml (not a run folder)")
    cfg = load_config(run_dir / "config.yaml")
    rows = read_metrics(run_dir)
    train = [r for r in rows if isinstance(r.get("step"), int) and r["step"] >= 1]
    if len(train) < 5:
        raise ValueError(f"{run_dir}: {len(train)} training steps logged; need at least 5")
    skip = max(1, len(train) // 10) if skip_first is None else skip_first
    window = steady_window(rows, skip)
    staleness = cfg.staleness_bound
    notes = []
    if cfg.mode == "staged":
        raise ValueError(f"{run_dir}: mode staged (Mu-GRPO) is not modelled; plan from a sync run")
    if cfg.dapo.dynamic_sampling:
        notes.append("DAPO's extra generation batches are not modelled: generation per step is "
                     "taken as the run's mean")
    work = Workload(cfg.rollout.prompts_per_step, cfg.rollout.prompts_per_work,
                    cfg.weight_sync.sync_every)
    items = item_records(window)
    update = [r.get("timing/update") for r in window]
    tokens = [step_train_tokens(r) for r in window]
    sync = [r.get("timing/sync") for r in window if is_number(r.get("timing/sync"))]
    other = [r["perf/step_time"] - r["perf/learner_idle_s"] - r.get("timing/update", 0.0)
             - (r.get("timing/sync") or 0.0) - (r.get("timing/eval") or 0.0)
             for r in window if is_number(r.get("perf/step_time"))
             and is_number(r.get("perf/learner_idle_s"))]
    pairs = [(t, u) for t, u in zip(tokens, update) if is_number(t) and is_number(u)]
    per_token = 0.0
    if len(pairs) >= 5 and np.std([t for t, _ in pairs]) > 0:
        per_token = max(0.0, float(np.polyfit([t for t, _ in pairs], [u for _, u in pairs], 1)[0]))
    if staleness == 0:
        broadcast = _mean(sync)
    else:  # waits for the item in progress are in it: the quick ones are closest to the broadcast
        broadcast = float(np.percentile(sync, 10)) if sync else math.nan
        notes.append(f"measured from a {cfg.mode} run (max_staleness {staleness}): its weight-sync "
                     "times include waiting for the actor's work item in progress (the broadcast "
                     "is taken as their 10th percentile) and generation overlaps the learner; a "
                     "sync run measures both apart")
    learner = LearnerCosts(fixed_s=max(0.0, _mean(other)), update_s=_mean(update),
                           update_s_per_token=per_token, mean_train_tokens=_mean(tokens),
                           broadcast_s=0.0 if math.isnan(broadcast) else broadcast)
    per_step_items = [sum(rec[0] for rec in (r.get("gen/work_items") or [])) for r in window]
    items_per_step = math.ceil(work.prompts_per_step / work.prompts_per_work)
    gap = 0.0
    if staleness == 0 and cfg.actors.count == 1:
        waits = [r["perf/learner_idle_s"] for r in window if is_number(r.get("perf/learner_idle_s"))]
        gap = max(0.0, (_mean(waits) - _mean(per_step_items)) / items_per_step)
    else:
        notes.append("the actor's time per item outside sampling (messages) is measured only in "
                     "a sync run with one actor: taken as 0")
    train_per_group = [t / work.prompts_per_step for t in tokens if is_number(t)]
    lengths = [r["resp/len_q"] for r in window if isinstance(r.get("resp/len_q"), list)]
    generation = fit_generation(items, lengths, train_per_group, work.prompts_per_work, gap)
    full = [it.seconds for it in items if it.prompts == work.prompts_per_work]
    return Measurements(
        run_dir=str(run_dir), mode=cfg.mode, max_staleness=staleness, actors=cfg.actors.count,
        learner_ranks=cfg.learner.ranks, algorithm=cfg.algorithm, workload=work, learner=learner,
        generation=generation, item_s_mean=_mean(full) + gap, items=len(full),
        measured=run_throughput(rows, cfg.actors.count, skip), notes=notes)
