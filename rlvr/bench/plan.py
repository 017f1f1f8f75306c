"""`rlvr bench plan`: does the planner predict this machine's measured steps/min?

    rlvr bench plan configs/tiny-cpu.yaml [--steps 100] [--staleness 0,1,2,4] [--out DIR]

Trains the config once in `mode=sync` (the measurement run) and once in `mode=async` at each
`--staleness` bound (same steps, evaluation only after the last step, as `rlvr bench throughput`
does; finished runs are reused), then asks the planner (rlvr/plan/) to predict every one of them
from the sync run's measurements alone: `measure` (work items, lengths, learner update and
broadcast times) and `simulate` with the runs' own split (actors.count actors, learner.ranks
ranks). Reported per run: measured and predicted steps/min and their error, the same for the
max(G / A, T) overlap bound (what a hand calculation from G and T gives), busy fractions, weight
sync seconds per step and the staleness reached. Target: every prediction within 10%.

This machine is not the cluster the model describes: actor and learner share its cores (and
whatever else runs on it), so when they compute at once each can be slower than in the sync run
that measured them. Run it on an idle machine; `results.json` keeps each run's load average.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.bench.common import (machine, markdown_table, run_overrides, targets_table, train_run,
                               write_results)
from rlvr.bench.reduce import run_throughput, target
from learner.run_log import read_metrics

TOLERANCE = 0.10


def run(config: str, out_dir: Path, overrides: list[str], steps: int | None,
        staleness: tuple[int, ...] = (0, 1, 2, 4), sim_seeds: int = 5) -> dict:
    from protocol.config import load_config
    from rlvr.plan.measure import measure
    from rlvr.plan.report import overlap_bound_steps_per_min, predict
    from rlvr.plan.sim import Split

    cfg = load_config(config, run_overrides(overrides, steps, []))
    skip = max(1, cfg.run.steps // 10)
    base = [f"run.eval_every={cfg.run.steps}", *overrides]
    variants = {"sync": ["mode=sync"]}
    variants.update({f"async_s{s}": ["mode=async", f"max_staleness={s}"] for s in staleness})
    runs, launches = {}, {}
    for name, variant in variants.items():
        runs[name], launches[name] = train_run(config, out_dir, name,
                                               run_overrides(base, steps, variant))
    m = measure(runs["sync"], skip_first=skip)
    rows = {}
    for name, run_dir in runs.items():
        got = run_throughput(read_metrics(run_dir), cfg.actors.count, skip)
        s = 0 if name == "sync" else int(name.split("_s")[1])
        split = Split(cfg.actors.count, cfg.learner.ranks, s)
        pred = predict(m, split, steps=cfg.run.steps, seeds=sim_seeds)
        bound = overlap_bound_steps_per_min(m, split)
        rows[name] = {"measured": got, "predicted": pred, "bound_steps_per_min": bound,
                      "error": _err(pred["steps_per_min"], got["steps_per_min"]),
                      "bound_error": _err(bound, got["steps_per_min"])}
    results = {
        "bench": "plan", "config": str(config), "overrides": overrides, "steps": cfg.run.steps,
        "skip_first_steps": skip, "actors": cfg.actors.count, "learner_ranks": cfg.learner.ranks,
        "measurement_run": str(runs["sync"]), "notes": m.notes,
        "costs": {"item_s": m.item_s_mean, "items": m.items, "learner": vars(m.learner),
                  "generation_scale": m.generation.scale, "gap_s": m.generation.gap_s},
        "runs": {n: str(d) for n, d in runs.items()}, "launches": launches,
        "modes": rows, "machine": machine(),
        "targets": {f"{name}_within_10pct": target(
            f"{name}: |predicted - measured| / measured steps/min <= {TOLERANCE}",
            abs(r["error"]) if r["error"] is not None else None, "<=", TOLERANCE)
            for name, r in rows.items()},
    }
    write_results(out_dir, results)
    print(report(results))
    print(f"results: {out_dir / 'results.json'}")
    return results


def _err(predicted, measured):
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def report(results: dict) -> str:
    rows = []
    for name, r in results["modes"].items():
        got, pred = r["measured"], r["predicted"]
        rows.append([name, got["steps_per_min"], pred["steps_per_min"], _pct(r["error"]),
                     r["bound_steps_per_min"], _pct(r["bound_error"]),
                     f"{got['learner_busy_frac']:.2f} / {pred['learner_busy_frac']:.2f}",
                     f"{got['actor_busy_frac']:.2f} / {pred['actor_busy_frac']:.2f}",
                     f"{got['sync_s_per_step']:.3f} / {pred['sync_s_per_step']:.3f}",
                     f"{got['stale_max']:.0f} / {pred['stale_max']}"])
    table = markdown_table(["run", "measured steps/min", "predicted", "error",
                            "max(G/A,T) bound", "bound error", "learner busy (m / p)",
                            "actor busy (m / p)", "sync s/step (m / p)", "stale max (m / p)"],
                           rows)
    c = results["costs"]
    head = (f"measured in {results['measurement_run']}: {c['items']} work items, "
            f"{c['item_s']:.4f} s each (model scale {c['generation_scale']:.2f}), learner "
            f"update {c['learner']['update_s']:.4f} s, broadcast {c['learner']['broadcast_s']:.4f} "
            f"s, rest {c['learner']['fixed_s']:.4f} s per step\n")
    return f"{head}\n{table}\n{targets_table(results['targets'])}"
