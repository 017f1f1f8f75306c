"""`rlvr bench plan`: does the planner predict this machine's measured steps/min?

    rlvr bench plan configs/tiny-cpu.yaml [--steps 100] [--staleness 0,1,2,4] [--out DIR]

Trains the config once in `mode=sync` (the measurement run) and once in `mode=async` at each
`--staleness` bound (same steps, evaluation only after the last step, as `rlvr bench throughput`
does; finished runs are reused), then asks the planner (rlvr/plan/) to predict every one of them
from the sync run's measurements alone: `measure` (stages, lengths, learner update and
broadcast times, the engine's decode step costs by rows from rlvr/plan/decode_probe.py, and the
actor loop's own time per step calibrated so the simulated sync run waits as the run did) and
`simulate` with the runs' own split (actors.count actors, learner.ranks ranks). Reported per run: measured steps/min and three predictions with their errors:
  - this machine: the simulator with actor and learner sharing this machine's cores, each
    slowed while the other computes by the factor rlvr/plan/contention.py measures here (two
    real processes running the run's generation and update, alone and together);
  - cluster: the same simulation with a device per process (what `rlvr plan` assumes);
  - the max(G / A, T) overlap bound (a hand calculation from G and T);
and the busy fractions, weight-sync seconds per step and staleness reached, measured / predicted.
Target: every "this machine" prediction within 10%; the cluster model's errors are listed as
targets too, for comparison (on an idle machine they show what ignoring the sharing costs).

In a sync run actor and learner take turns, so it measures each alone; in async they compute at
once, which on a shared machine costs what the contention probe measures and on a cluster costs
nothing. Run it on an idle machine: another workload changes the slowdown between the probe and
the runs (`results.json` keeps each run's load average).
"""

from __future__ import annotations

import os
from pathlib import Path

from rlvr.bench.common import (machine, markdown_table, names, run_overrides, targets_table,
                               train_run, write_results)
from rlvr.bench.run_metrics import run_throughput
from rlvr.bench.targets import target
from learner.run_log import read_metrics

TOLERANCE = 0.10


def run(config: str, out_dir: Path, overrides: list[str], steps: int | None,
        staleness: tuple[int, ...] = (0, 1, 2, 4), sim_seeds: int = 5) -> dict:
    from protocol.config import load_config
    from rlvr.plan.contention import measure_slowdown
    from rlvr.plan.measure import measure
    from rlvr.plan.sim import Machine

    cfg = load_config(config, run_overrides(overrides, steps, []))
    skip = max(1, cfg.run.steps // 10)
    base = [f"run.eval_every={cfg.run.steps}", *overrides]
    variants = {"sync": ["mode=sync"]}
    variants.update({f"async_s{s}": ["mode=async", f"max_staleness={s}"] for s in staleness})
    runs, launches = {}, {}
    for name, variant in variants.items():
        runs[name], launches[name] = train_run(config, out_dir, name,
                                               run_overrides(base, steps, variant))
    m = measure(runs["sync"], skip_first=skip)  # runs the decode probe once (kept in the run)
    print("bench: measuring how actor and learner slow each other on this machine", flush=True)
    contention = measure_slowdown(runs["sync"])
    shared = Machine(shared_cores=float(os.cpu_count() or 1),
                     actor_slowdown=contention["actor_slowdown"],
                     learner_slowdown=contention["learner_slowdown"])
    rows = {name: _mode_row(name, run_dir, cfg, m, shared, skip, sim_seeds)
            for name, run_dir in runs.items()}
    results = {
        "bench": "plan", "config": str(config), "overrides": overrides, "steps": cfg.run.steps,
        "skip_first_steps": skip, "actors": cfg.actors.count, "learner_ranks": cfg.learner.ranks,
        "measurement_run": str(runs["sync"]), "notes": m.notes,
        "contention": contention, "shared_machine": vars(shared),
        "costs": {"G_s": m.gen_s_per_step, "items": m.items, "learner": vars(m.learner),
                  "decode": vars(m.decode), "decode_overhead_s": m.overhead_s,
                  "decode_scale": m.decode_scale,
                  "decode_probe": m.decode_probe},
        "runs": {n: str(d) for n, d in runs.items()}, "launches": launches,
        "modes": rows, "machine": machine(),
        "targets": _targets(rows),
    }
    write_results(out_dir, results)
    print(report(results))
    print(f"results: {out_dir / 'results.json'}")
    return results


def _mode_row(name: str, run_dir: Path, cfg, m, shared, skip: int, sim_seeds: int) -> dict:
    """One run's measured steps/min beside the plan's predictions, on this machine (`shared`)
    and on a cluster, and the max(G / A, T) bound."""
    from rlvr.plan.report import overlap_bound_steps_per_min, predict
    from rlvr.plan.sim import Split

    got = run_throughput(read_metrics(run_dir), cfg.actors.count, skip)
    s = 0 if name == "sync" else int(name.split("_s")[1])
    split = Split(cfg.actors.count, cfg.learner.ranks, s, cfg.actors.inflight_update,
                  cfg.stale_policy, cfg.actors.abort_limit)
    here = predict(m, split, steps=cfg.run.steps, seeds=sim_seeds, machine=shared,
                   skip_first=skip)
    cluster = predict(m, split, steps=cfg.run.steps, seeds=sim_seeds, skip_first=skip)
    bound = overlap_bound_steps_per_min(m, split)
    return {"measured": got, "predicted": here, "predicted_cluster": cluster,
            "bound_steps_per_min": bound,
            "error": _err(here["steps_per_min"], got["steps_per_min"]),
            "cluster_error": _err(cluster["steps_per_min"], got["steps_per_min"]),
            "bound_error": _err(bound, got["steps_per_min"])}


def _targets(rows: dict) -> dict:
    """Each run's prediction within TOLERANCE; the cluster model's too, for comparison (it
    ignores that actor and learner share this machine's cores)."""
    found = {}
    for key, label, field in (("", "this machine", "error"),
                              ("_cluster_model", "cluster", "cluster_error")):
        for name, r in rows.items():
            err = r[field]
            found[f"{name}{key}_within_10pct"] = target(
                f"{name}: |predicted ({label}) - measured| / measured steps/min <= {TOLERANCE}",
                abs(err) if err is not None else None, "<=", TOLERANCE)
    return found


def _err(predicted, measured):
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def report(results: dict) -> str:
    from rlvr.plan.report import decode_line

    rows = []
    for name, r in results["modes"].items():
        got, pred, clu = r["measured"], r["predicted"], r["predicted_cluster"]
        rows.append([name, got["steps_per_min"], pred["steps_per_min"], _pct(r["error"]),
                     clu["steps_per_min"], _pct(r["cluster_error"]),
                     r["bound_steps_per_min"], _pct(r["bound_error"]),
                     f"{got['learner_busy_frac']:.2f} / {pred['learner_busy_frac']:.2f}",
                     f"{got['actor_busy_frac']:.2f} / {pred['actor_busy_frac']:.2f}",
                     f"{got['sync_s_per_step']:.3f} / {pred['sync_s_per_step']:.3f}",
                     f"{got['stale_max']:.0f} / {pred['stale_max']}"])
    table = markdown_table(["run", "measured steps/min", "predicted (this machine)", "error",
                            "predicted (cluster)", "error", "max(G/A,T) bound", "error",
                            "learner busy (m / p)", "actor busy (m / p)", "sync s/step (m / p)",
                            "stale max (m / p)"], rows)
    c, k = results["costs"], results["contention"]
    head = (f"measured in {results['measurement_run']}: generation {c['G_s']:.4f} s per step "
            f"({c['items']} work items), learner update {c['learner']['update_s']:.4f} s, "
            f"broadcast {c['learner']['broadcast_s']:.4f} s, rest {c['learner']['fixed_s']:.4f} s "
            f"per step; {decode_line(c)}\n"
            f"this machine: {results['shared_machine']['shared_cores']:g} cores shared; computing "
            f"at once, the actor runs {k['actor_slowdown']:.2f}x and the learner "
            f"{k['learner_slowdown']:.2f}x slower than alone (rlvr/plan/contention.py); the "
            f"cluster model gives each a device of its own\n")
    return f"{head}\n{table}\n{targets_table(results['targets'])}"


# ---- the command line: `rlvr bench plan` (rlvr/bench/cli.py lists this module) ----

HELP = "rlvr plan's predicted steps/min against measured runs"
NEEDS_CONFIG = True


def add_arguments(p) -> None:
    p.add_argument("--staleness", default="0,1,2,4",
                   help="async runs' max_staleness values, comma-separated (the sync run is "
                        "always trained: it is the measurement)")


def check(args) -> str | None:
    if not all(s.isdigit() for s in names(args.staleness)) or not names(args.staleness):
        return f"--staleness: bounds >= 0, comma-separated, not {args.staleness!r}"
    return None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, overrides, args.steps, tuple(int(s) for s in names(args.staleness)))
