"""`rlvr plan RUN_DIR`: predicted steps/min of cluster splits, from one run's measured costs.

    rlvr plan runs/sync [--actors 1,2,4,8] [--learner-ranks 1,2] [--max-staleness 0,1,2,4]
                        [--inflight-update finish,continue,abort,recompute] [--gpus N] [--steps 400]
                        [--seeds 3] [--allreduce-s X] [--out DIR]
                        [--staleness-curve runs/bench/staleness/results.json]

For every combination, the simulator (rlvr/plan/sim.py) plays the run's schedule with A actors
and R learner ranks, each on a device of its own, the generation model fitted to the run
(rlvr/plan/model.py) and the engine's measured decode costs (rlvr/plan/decode_probe.py, run
once on this machine: plan where the actors' engine runs); the table gives steps/min (mean over
seeds), the learner's and the actors' busy fractions, the weight-sync seconds per step and the
staleness reached, per trained group: the learner's version less that of the group's first token
(metrics.jsonl's stale/mean is another measure: per token, by the version that sampled it, so
long answers weigh more). Beside it, max(G / A, T) is the overlap bound most back-of-envelope plans use
(G = a step's generation on one actor, T = the learner's own work); the simulation is below it
by what the schedule costs (admission, stages, waits at weight syncs), and can exceed it when
actors batch more requests at once than the measured run did. For each GPU budget in the table
(one device per actor and per learner rank) it recommends the split with the most steps/min, the
least staleness among equals. With --staleness-curve, a column names the objectives whose
measured tolerance (`rlvr bench staleness`: the largest injected K within 2 points of K = 0)
covers each split's predicted staleness.

What the model assumes (separate devices, as on a cluster): actors never slow the learner or
each other; R ranks share an update perfectly (plus --allreduce-s per update); the broadcast
takes the measured time whatever the number of actors. On one shared machine (the 2-core
development box) actors and learner compete for the same cores and memory: more actors than
free cores do not generate more, and the learner's update slows while an actor generates.
BENCHMARKS.md ("Planning a split") has the measured comparison.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, replace
from pathlib import Path

from rlvr.plan.measure import DECODE_COST_FILE, Measurements, measure, read_probe
from rlvr.plan.sim import CLUSTER, Machine, Split, simulate


def predict(m: Measurements, split: Split, steps: int = 400, seeds: int = 3,
            allreduce_s: float = 0.0, machine: Machine = CLUSTER,
            skip_first: int | None = None) -> dict:
    """Mean over seeds of the simulated rates for `split`, driven by `m`."""
    costs = replace(m.learner, allreduce_s=allreduce_s)
    runs = [simulate(split, m.workload, costs, m.generation, m.decode, steps=steps, seed=s,
                     skip_first=skip_first, machine=machine) for s in range(seeds)]

    def avg(name: str) -> float:
        return sum(getattr(r, name) for r in runs) / len(runs)

    return {"actors": split.actors, "learner_ranks": split.learner_ranks,
            "max_staleness": split.max_staleness, "inflight_update": split.inflight_update,
            "steps_per_min": avg("steps_per_min"),
            "learner_busy_frac": avg("learner_busy_frac"),
            "actor_busy_frac": avg("actor_busy_frac"), "sync_s_per_step": avg("sync_s_per_step"),
            "stale_mean": avg("stale_mean"), "stale_max": max(r.stale_max for r in runs),
            "stale_policy": split.stale_policy, "dropped_groups": avg("dropped_groups"),
            "over_bound_groups": avg("over_bound_groups"),
            "bound_steps_per_min": overlap_bound_steps_per_min(m, split, allreduce_s)}


def step_costs(m: Measurements, ranks: int = 1, allreduce_s: float = 0.0) -> tuple[float, float]:
    """(G, T): a step's generation on one actor and the learner's own work per step."""
    g = m.gen_s_per_step
    t = (m.learner.fixed_s + m.learner.update(ranks, m.learner.mean_train_tokens)
         + m.learner.broadcast_s / m.workload.sync_every)
    return g, t + (allreduce_s if ranks > 1 else 0.0)


def overlap_bound_steps_per_min(m: Measurements, split: Split, allreduce_s: float = 0.0) -> float:
    g, t = step_costs(m, split.learner_ranks, allreduce_s)
    step = g / split.actors + t if split.max_staleness == 0 else max(g / split.actors, t)
    return 60.0 / step


def plan(run_dir: str | Path, actors: list[int], ranks: list[int], staleness: list[int],
         steps: int = 400, seeds: int = 3, allreduce_s: float = 0.0,
         gpus: int | None = None, machine: Machine = CLUSTER,
         inflight: list[str] | None = None, decode_profile: str | Path | None = None) -> dict:
    """`decode_profile`: a decode probe's result (decode_cost.json) from another engine or
    machine, used instead of probing the run's: its costs' shape is taken, their scale is
    calibrated on the run's sync waits as a probe's is."""
    probe = None
    if decode_profile is not None:
        probe = read_probe(decode_profile, "give a file a decode probe wrote "
                                           f"(RUN_DIR/{DECODE_COST_FILE})")
    m = measure(run_dir, decode_probe=probe)
    if decode_profile is not None:
        m.notes.append(f"decode costs from {decode_profile}, not probed on this run's engine")
    policies = inflight or [m.inflight_update]
    # in sync nothing is in flight when weights come: one row, whatever the policy
    splits = [Split(a, r, s, p, m.stale_policy, m.abort_limit)
              for a, r, s, p in itertools.product(actors, ranks, staleness, policies)
              if s > 0 or p == policies[0]]
    rows = [predict(m, split, steps, seeds, allreduce_s, machine) for split in splits]
    g, t = step_costs(m)
    return {"run_dir": str(run_dir), "measured": m.measured, "notes": m.notes,
            "costs": {"G_s": g, "T_s": t, "items": m.items, "learner": asdict(m.learner),
                      "decode": asdict(m.decode), "decode_overhead_s": m.overhead_s,
                      "decode_scale": m.decode_scale,
                      "stay_rate": m.generation.stay_rate,
                      "responses_per_active": m.generation.responses_per_active},
            "run_split": {"actors": m.actors, "learner_ranks": m.learner_ranks,
                          "mode": m.mode, "max_staleness": m.max_staleness},
            "machine": asdict(machine), "rows": rows, "recommended": recommend(rows, gpus)}


def decode_line(c: dict) -> str:
    d = c["decode"]
    return (f"an actor's decode step {1000 * d['step_s']:.2f} ms + {1000 * d['row_s']:.3f} ms per "
            f"row + {1e6 * d['col_s']:.3f} us per row and token of context (of it "
            f"{1000 * c['decode_overhead_s']:.2f} ms the actor loop's own, calibrated), a "
            f"request's start {1000 * d['prefill_row_s']:.3f} ms + {1e6 * d['prefill_col_s']:.3f} "
            f"us per column of its width + {1e9 * d['prefill_sq_s']:.3f} ns per column squared "
            f"(a fresh one {d['prompt_width']:.0f} columns wide), "
            f"+ {1e12 * d['prefill_tokens_sq_s']:.3f} ps per (rows x width)^2 of the prefill, "
            f"+ {1000 * d['prefill_s']:.2f} ms per step that starts some")


def recommend(rows: list[dict], gpus: int | None = None) -> dict[int, dict]:
    """Per GPU budget (actors + learner ranks; only `gpus` when given): the row with the most
    steps/min; within 2% of it, the one with the least staleness, then the fewest GPUs."""
    best: dict[int, dict] = {}
    budgets = sorted({r["actors"] + r["learner_ranks"] for r in rows})
    for budget in budgets if gpus is None else [gpus]:
        fits = [r for r in rows if r["actors"] + r["learner_ranks"] <= budget]
        if not fits:
            continue
        top = max(r["steps_per_min"] for r in fits)
        near = [r for r in fits if r["steps_per_min"] >= 0.98 * top]
        best[budget] = min(near, key=lambda r: (r["max_staleness"], r["actors"] + r["learner_ranks"],
                                                -r["steps_per_min"]))
    return best


def _mode(r: dict) -> str:
    s, policy = r["max_staleness"], r.get("inflight_update", "finish")
    return "sync" if s == 0 else f"async S={s}" + ("" if policy == "finish" else f", {policy}")


def report(result: dict) -> str:
    from rlvr.bench.common import markdown_table

    c, run = result["costs"], result["run_split"]
    base = next((r["steps_per_min"] for r in result["rows"] if r["actors"] == 1
                 and r["learner_ranks"] == 1 and r["max_staleness"] == 0), None)
    safe = result.get("safe_staleness")  # objective -> largest K within 2 points, or None
    rows = [[r["actors"], r["learner_ranks"], _mode(r), r["steps_per_min"],
             r["steps_per_min"] / base if base else None, r["bound_steps_per_min"],
             r["learner_busy_frac"], r["actor_busy_frac"], f"{r['sync_s_per_step']:.3f}",
             f"{r['stale_mean']:.2f}", r["stale_max"],
             *([safe_objectives(r["stale_max"], safe)] if safe else [])]
            for r in result["rows"]]
    table = markdown_table(["actors", "learner ranks", "schedule", "steps/min",
                            "x 1+1 sync", "max(G/A,T) bound", "learner busy", "actor busy",
                            "sync s/step", "stale mean", "stale max",
                            *(["objectives safe at it"] if safe else [])], rows)
    head = (f"measured in {result['run_dir']} ({run['mode']}, {run['actors']} actor(s), "
            f"{run['learner_ranks']} learner rank(s)): G = {c['G_s']:.3f} s of generation per "
            f"step on one actor, T = {c['T_s']:.3f} s of learner work (update "
            f"{c['learner']['update_s']:.3f}, broadcast {c['learner']['broadcast_s']:.4f}, rest "
            f"{c['learner']['fixed_s']:.3f}); {decode_line(c)}\n")
    rec = "\n".join(f"- {b} GPUs: {r['actors']} actor(s) + {r['learner_ranks']} learner rank(s), "
                    f"{_mode(r)}: {r['steps_per_min']:.1f} steps/min"
                    for b, r in result["recommended"].items())
    notes = "".join(f"note: {n}\n" for n in result["notes"])
    if safe:
        notes += ("staleness curve " + result["staleness_curve"] + ": largest K within 2 points "
                  "of K = 0 " + ", ".join(f"{o} {'-' if k is None else k}"
                                          for o, k in safe.items()) + "\n")
    mach = result.get("machine") or {}
    if mach.get("shared_cores") is not None:
        notes += (f"machine: actors and learner ranks share {mach['shared_cores']:g} cores "
                  f"(slowdown when computing beside another: actor "
                  f"{mach['actor_slowdown']:.2f}, learner {mach['learner_slowdown']:.2f})\n")
    else:
        notes += "machine: every actor and learner rank on a device of its own (a cluster)\n"
    return f"{head}{notes}\n{table}\nrecommended split per GPU budget (one device per actor " \
           f"and per learner rank):\n{rec}\n"


def safe_staleness(curve_path: str) -> dict[str, int | None]:
    """objective -> the largest injected staleness whose final eval/avg@8 stayed within 2
    points of K = 0, from `rlvr bench staleness`'s results.json."""
    from rlvr.bench.staleness import tolerance

    cells = json.loads(Path(curve_path).read_text())["cells"]
    return {o: tolerance({int(k): c for k, c in by_k.items()}) for o, by_k in cells.items()}


def safe_objectives(stale_max: float, safe: dict[str, int | None]) -> str:
    """The objectives whose measured safe range covers a split's predicted staleness."""
    return ", ".join(o for o, k in safe.items() if k is not None and stale_max <= k) or "none"


def run(args) -> int:
    def ints(text: str, what: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise SystemExit(f"rlvr plan: {what}: whole numbers, comma-separated, not {text!r}")
        if not values or min(values) < (0 if what == "--max-staleness" else 1):
            raise SystemExit(f"rlvr plan: {what} must list numbers >= "
                             f"{0 if what == '--max-staleness' else 1}, got {text!r}")
        return values

    actors = ints(args.actors, "--actors")
    ranks = ints(args.learner_ranks, "--learner-ranks")
    staleness = ints(args.max_staleness, "--max-staleness")
    inflight = [p.strip() for p in (args.inflight_update or "").split(",") if p.strip()] or None
    if inflight and not set(inflight) <= {"finish", "continue", "abort", "recompute"}:
        raise SystemExit(f"rlvr plan: --inflight-update: finish, continue, abort or recompute, "
                         f"comma-separated, not {args.inflight_update!r}")
    if args.steps < 20 or args.seeds < 1:
        raise SystemExit("rlvr plan: --steps must be >= 20 and --seeds >= 1")
    slow = [float(v) for v in args.slowdown.split(",")]
    if len(slow) not in (1, 2) or min(slow) <= 0:
        raise SystemExit(f"rlvr plan: --slowdown: one or two factors > 0 (actor[,learner]), "
                         f"not {args.slowdown!r}")
    if args.shared_cores is not None and args.shared_cores <= 0:
        raise SystemExit("rlvr plan: --shared-cores must be > 0")
    machine = Machine(args.shared_cores, slow[0], slow[-1])
    try:
        result = plan(args.run_dir, actors, ranks, staleness, args.steps, args.seeds,
                      args.allreduce_s, args.gpus, machine, inflight, args.decode_profile)
    except ValueError as e:
        print(f"rlvr plan: {e}", flush=True)
        return 2
    if args.staleness_curve:
        result["staleness_curve"] = args.staleness_curve
        result["safe_staleness"] = safe_staleness(args.staleness_curve)
    print(report(result))
    out = Path(args.out) if args.out else Path(args.run_dir) / "plan"
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"plan: {out / 'plan.json'}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("plan", help="predict steps/min of actor/learner splits from a run")
    p.add_argument("run_dir", help="a finished run folder (a sync run measures best)")
    p.add_argument("--actors", default="1,2,3,4,6,8", help="actor counts, comma-separated")
    p.add_argument("--learner-ranks", default="1,2", help="learner rank counts")
    p.add_argument("--max-staleness", default="0,1,2,4", help="bounds (0 = sync)")
    p.add_argument("--inflight-update",
                   help="actors.inflight_update policies to compare, comma-separated (finish, "
                        "continue, abort, recompute; default: the run's own)")
    p.add_argument("--gpus", type=int, help="recommend only for this many devices")
    p.add_argument("--steps", type=int, default=400, help="simulated learner steps per split")
    p.add_argument("--seeds", type=int, default=3, help="simulations per split (averaged)")
    p.add_argument("--allreduce-s", type=float, default=0.0,
                   help="gradient all-reduce seconds per update with > 1 learner rank")
    p.add_argument("--shared-cores", type=float,
                   help="model one machine whose cores actors and learner ranks share (default: "
                        "a device each, as on a cluster)")
    p.add_argument("--slowdown", default="1",
                   help="with --shared-cores: actor[,learner] slowdown while another process "
                        "computes (python -m rlvr.plan.contention RUN_DIR measures them)")
    p.add_argument("--decode-profile", metavar="FILE",
                   help="decode costs from another engine or machine (a decode probe's "
                        f"RUN_DIR/{DECODE_COST_FILE}) instead of probing the run's: their "
                        "shape is taken, their scale calibrated on the run's sync waits")
    p.add_argument("--out", help="folder for plan.json (default RUN_DIR/plan)")
    p.add_argument("--staleness-curve", help="results.json of `rlvr bench staleness`: show "
                   "which objectives stay within 2 points at each split's staleness")
    p.set_defaults(func=run)
