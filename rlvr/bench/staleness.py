"""`rlvr bench staleness`: how stale each objective can train (docs/ALGORITHMS.md 8.2b-8.2d).

    rlvr bench staleness configs/tiny-cpu.yaml mode=sync --inject 0,4,16,64 \\
        --objectives naive,decoupled,mugrpo,m2po --seeds 3 [--steps N] [--out DIR]

For every objective and seed, an `rlvr sweep` over `stale_inject` (K) in
`DIR/<objective>/seed<s>/`, every run from the same warm-started model (resumable as any sweep:
finished runs are reused; more Ks in --inject or a larger --seeds extend an earlier curve). Each run trains every
group K versions after the version that sampled it (after a K-step warm-up in which the delay line
fills). Then one table and one plot over all cells: final `eval/avg@8` and `eval/pass@8` (mean
and spread over seeds) against K per objective, the drop from the objective's own K = 0, and
per cell the share of tokens the trust region took out (`pg/clip_frac`, `m2po/masked_frac`,
`veto/token_frac_all`), `is/w_mean`, `is/w_truncated_frac` and the staleness trained
(`stale/mean`), each averaged over the run's steps. Written to DIR/staleness.md,
DIR/results.json and DIR/staleness_avg_at_8.png (and _pass_at_8).

K = 0 runs once per seed, under the first objective, and every objective shares it, wherever
their updates coincide on-policy (`shared_on_policy`: mode sync, one optimizer step a learner
step, no direct replay); elsewhere each objective runs its own.

The objectives differ only in their loss keys; every other key is the config's:
  naive      the PPO clip on pi_theta / pi_behav, no proximal policy, no behaviour weight
  decoupled  decoupled PPO (the default loss): clip around pi_prox, w = pi_prox / pi_behav
  mugrpo     Mu-GRPO's ratio to pi_behav, relaxed clip [0, 5] and the negative-advantage veto
  m2po       M2PO: no clip, the second-moment mask on pi_theta / pi_behav (tau 0.04)
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import yaml

from learner.code_version import label
from learner.run_log import SUMMARY_FILE, read_metrics
from rlvr.bench.common import BenchError, fmt, markdown_table, names, read_json, write_results
from rlvr.sweep import PLAN_FILE, sweep

OBJECTIVES: dict[str, list[str]] = {
    "naive": ["loss.old_policy=behaviour"],
    "decoupled": ["loss.old_policy=proximal"],
    "mugrpo": ["loss.old_policy=behaviour", "loss.clip_low=1.0", "loss.clip_high=4.0",
               "mugrpo.veto_scope=suffix"],
    "m2po": ["loss.old_policy=behaviour", "loss.trust_region=m2po"],
}
# per-step metrics averaged over a run: what the trust region took and what staleness it saw
TRAINING_MEANS = ("pg/clip_frac", "m2po/masked_frac", "veto/token_frac_all", "is/w_mean",
                  "is/w_truncated_frac", "stale/mean")
FINAL = ("eval/avg@8", "eval/pass@8")


def run(config: str, out: Path, overrides: list[str], steps: int | None, inject: list[int],
        objectives: list[str], seeds: int) -> dict:
    from protocol.config import load_config
    from rlvr.bench.common import shared_model

    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown or not objectives:
        raise BenchError(f"--objectives: unknown {unknown}; choose from {list(OBJECTIVES)}")
    fixed = [*overrides, *([f"run.steps={steps}"] if steps else [])]
    cfg = load_config(config, fixed, refuse_inert=False)
    model = shared_model(cfg)  # one start for all
    why_not = shared_on_policy(cfg)
    shared_from = objectives[0] if why_not is None and 0 in inject else None
    # seed by seed, so that an interrupted curve is balanced and more seeds extend it: each
    # (objective, seed) is a sweep over K of its own, DIR/<objective>/seed<s>/
    for seed in range(seeds):
        for name in objectives:
            folder = out / name / f"seed{seed}"
            ks = inject if shared_from in (None, name) or _plans_k0(folder) \
                else [k for k in inject if k != 0]
            if not ks:
                continue
            axis = f"stale_inject={','.join(str(k) for k in ks)}"
            # K is an axis even alone, so that a curve begun at one K takes more later
            if sweep(config, [*model, *fixed, *OBJECTIVES[name], f"run.seed={seed}", axis],
                     folder, axis_keys=("stale_inject",)) is None:
                raise BenchError(f"the {name} sweep in {folder} did not finish")
    found = [(name, cell) for name in objectives for seed in range(seeds)
             for cell in _cells(out, name, seed, shared_from)]
    runs = [(name, *cell[:3]) for name, cell in found]
    # a curve extended over sessions reuses runs: which code made them (the shared K = 0 once)
    codes = Counter(label(read_json(d / SUMMARY_FILE).get("code"))
                    for d in sorted({cell[3] for _, cell in found}))
    results = {"config": str(config), "overrides": overrides, "steps": steps, "inject": inject,
               "objectives": {o: OBJECTIVES[o] for o in objectives}, "seeds": seeds,
               "k0_shared_from": shared_from, "k0_not_shared_because": why_not,
               "cells": reduce_cells(runs),
               "codes": dict(sorted(codes.items(), key=lambda c: (-c[1], c[0])))}
    write_results(out, results)
    text = report(results)
    (out / "staleness.md").write_text(text)
    print(text, flush=True)
    for path in plot(results, out):
        print(path)
    return results


def shared_on_policy(cfg) -> str | None:
    """None when the objectives take the same update on data the current weights sampled, so
    that K = 0 needs one run per seed, not one per objective; else why not, naming the key.
    On-policy every ratio is 1 (to pi_behav and to pi_prox), so no clip, mask, veto or
    truncation acts and the four losses have the same gradient (tests/test_bench_staleness.py),
    as long as a learner step takes one optimizer step on fresh samples: a second one moves
    pi_theta away from pi_behav, where the objectives differ."""
    if cfg.mode != "sync":
        return f"mode {cfg.mode}: the run's own lag makes K = 0 off-policy"
    if cfg.optim.mini_batches != 1:
        return f"optim.mini_batches {cfg.optim.mini_batches}: later optimizer steps are off-policy"
    if cfg.optim.epochs != 1:
        return f"optim.epochs {cfg.optim.epochs}: later passes are off-policy"
    if cfg.ar3po.reuse_mode == "direct_replay":
        return "ar3po.reuse_mode direct_replay: replayed responses are ratioed to old log-probs"
    return None


def _plans_k0(folder: Path) -> bool:
    """Whether an earlier curve's sweep in `folder` has a K = 0 run of its own (curves from
    before K = 0 was shared): its plan is kept, so that more seeds or Ks extend it."""
    plan = read_json(folder / PLAN_FILE)
    return any("stale_inject=0" in r.get("overrides", []) for r in plan.get("runs", []))


def _cells(out: Path, name: str, seed: int, shared_from: str | None) -> list[tuple]:
    """(K, seed, rows, run folder) of the objective's finished runs for one seed, with the
    shared K = 0 run of `shared_from` where the objective has none of its own."""
    runs_dir = out / name / f"seed{seed}" / "runs"
    own = [(*run_cell(d), d) for d in sorted(runs_dir.iterdir()) if d.is_dir()] \
        if runs_dir.is_dir() else []
    if shared_from and shared_from != name and not any(c[0] == 0 for c in own):
        own += [c for c in _cells(out, shared_from, seed, None) if c[0] == 0]
    return own


def run_cell(run_dir: Path) -> tuple[int, int, list[dict]]:
    """(K, seed, metric rows) of one finished run, K and seed read from its resolved config."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    return int(cfg.get("stale_inject", 0)), int(cfg["run"]["seed"]), read_metrics(run_dir)


def _last(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return float(values[-1]) if values else None


def _mean(values: list) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


def reduce_cells(runs: list[tuple[str, int, int, list[dict]]]) -> dict:
    """objective -> K -> {final metric: {mean, std, n, values, by_seed}, seeds, training means,
    drop_points}.
    `drop_points` is 100 x (the objective's mean final eval/avg@8 at its smallest K minus this
    K's): how much accuracy the staleness cost, in points."""
    cells: dict[str, dict[int, dict]] = {}
    for objective, k, seed, rows in runs:
        cell = cells.setdefault(objective, {}).setdefault(k, {"seeds": [], "runs": []})
        cell["seeds"].append(seed)
        cell["runs"].append(rows)
    out: dict[str, dict[int, dict]] = {}
    for objective, by_k in cells.items():
        out[objective] = {}
        for k in sorted(by_k):
            seeds, runs_k = zip(*sorted(zip(by_k[k]["seeds"], by_k[k]["runs"]),
                                        key=lambda pair: pair[0]))
            cell = {"seeds": list(seeds)}
            for key in FINAL:
                found = [(seed, v) for seed, v in zip(seeds, (_last(r, key) for r in runs_k))
                         if v is not None]
                finals = [v for _, v in found]
                # per seed, so that a seed that collapsed shows (a mean and sd hide it)
                by_seed = {str(seed): v for seed, v in found}
                cell[key] = {"mean": _mean(finals), "n": len(finals),
                             "std": statistics.stdev(finals) if len(finals) > 1 else None,
                             "values": finals, "by_seed": by_seed}
            training = [[r for r in rows if r.get("step", 0) > 0] for rows in runs_k]
            for key in TRAINING_MEANS:
                cell[key] = _mean([_mean([r.get(key) for r in rows]) for rows in training])
            out[objective][k] = cell
        base = out[objective][min(out[objective])]["eval/avg@8"]["mean"]
        for cell in out[objective].values():
            now = cell["eval/avg@8"]["mean"]
            cell["drop_points"] = None if None in (base, now) else 100 * (base - now)
    return out


def tolerance(cells_of_objective: dict, points: float = 2.0) -> int | None:
    """The largest K before the first K whose final eval/avg@8 fell more than `points` below
    the objective's smallest K (None when even the next K past the smallest fell)."""
    ks = sorted(cells_of_objective)
    safe = None
    for k in ks:
        drop = cells_of_objective[k]["drop_points"]
        if drop is not None and drop > points:
            break
        safe = k
    return safe


def report(results: dict) -> str:
    cells = results["cells"]
    headers = ["objective", "K", "seeds", "eval/avg@8", "per seed", "drop (pts)", "eval/pass@8",
               "clip frac", "m2po masked", "veto frac", "is/w_mean", "w truncated",
               "stale/mean"]
    rows = []
    for objective, by_k in cells.items():
        for k, c in by_k.items():
            def spread(key: str) -> str:
                m, s = c[key]["mean"], c[key]["std"]
                return fmt(m, 3) + ("" if s is None else f" ± {s:.3f}")

            by_seed = c["eval/avg@8"]["by_seed"]
            rows.append([objective, str(k), str(len(c["seeds"])), spread("eval/avg@8"),
                         " ".join(fmt(by_seed.get(str(seed)), 3) for seed in c["seeds"]),
                         fmt(c["drop_points"], 1), spread("eval/pass@8"),
                         fmt(c["pg/clip_frac"], 4), fmt(c["m2po/masked_frac"], 4),
                         fmt(c["veto/token_frac_all"], 4), fmt(c["is/w_mean"], 3),
                         fmt(c["is/w_truncated_frac"], 4), fmt(c["stale/mean"], 1)])
    lines = [f"# Staleness tolerance: {results['config']} {' '.join(results['overrides'])}", "",
             markdown_table(headers, rows),
             "Largest K within 2 points of the objective's K = 0 (final eval/avg@8, mean over "
             "seeds):"]
    for objective, by_k in cells.items():
        base = min(by_k)  # the drop is measured from it (reduce_cells)
        lines.append(f"- {objective}: K = {fmt(tolerance(by_k))}" + (
            "" if base == 0 else f" (drop measured from K = {base}: the curve has no K = 0)"))
    if results.get("codes"):
        lines.append("\nRuns made by code: " + ", ".join(
            f"{code} ({n} run{'s' if n > 1 else ''})" for code, n in results["codes"].items())
            + ("; the cells may differ by more than staleness"
               if len(results["codes"]) > 1 else ""))
    if results.get("k0_shared_from"):
        lines.append(f"\nK = 0 is one run per seed, {results['k0_shared_from']}'s, shared by every "
                     "objective: on-policy their updates coincide.")
    elif results.get("k0_not_shared_because"):
        lines.append(f"\nK = 0 is run per objective ({results['k0_not_shared_because']}).")
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> list[Path]:
    from rlvr.bench.plots import _axes, _save

    paths = []
    for key in FINAL:
        fig, ax = _axes(f"Final {key} against injected staleness (mean ± std over seeds)",
                        "injected staleness K (versions)", key)
        for i, (objective, by_k) in enumerate(results["cells"].items()):
            ks = [k for k in by_k if by_k[k][key]["mean"] is not None]
            ax.errorbar(ks, [by_k[k][key]["mean"] for k in ks],
                        yerr=[by_k[k][key]["std"] or 0.0 for k in ks], marker="o", capsize=3,
                        color=f"C{i}", label=objective)
        ax.set_xscale("symlog", linthresh=1)
        ax.legend()
        paths.append(_save(fig, out / f"staleness_{key.split('/')[1].replace('@', '_at_')}.png"))
    return paths


# ---- the command line: `rlvr bench staleness` (rlvr/bench/cli.py lists this module) ----

HELP = "final accuracy against injected staleness per objective"
NEEDS_CONFIG = True


def add_arguments(p) -> None:
    p.add_argument("--inject", default="0,4,16,64",
                   help="injected staleness values K (stale_inject), comma-separated")
    p.add_argument("--objectives", default="naive,decoupled,mugrpo,m2po",
                   help="comma-separated of naive, decoupled, mugrpo, m2po")
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell (run.seed 0..K-1)")


def check(args) -> str | None:
    unknown = [o for o in names(args.objectives) if o not in OBJECTIVES]
    if unknown or not names(args.objectives):
        return f"--objectives: unknown {unknown}; choose from {list(OBJECTIVES)}"
    if not all(k.isdigit() for k in names(args.inject)) or not names(args.inject):
        return f"--inject: staleness values >= 0, comma-separated, not {args.inject!r}"
    return "--seeds must be >= 1" if args.seeds < 1 else None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, overrides, args.steps, [int(k) for k in names(args.inject)],
        list(names(args.objectives)), args.seeds)
