"""`rlvr bench efficiency`: how many responses each algorithm generates, and what they buy.

    rlvr bench efficiency configs/tiny-cpu.yaml [--seeds 3] [--steps 200] [--out DIR] [a.b=v ...]

Trains grpo, dapo, ar3po, aero and hora (`--algorithms` to choose) on the same config: same
task, model, steps and prompts per step; only `algorithm=` and `run.seed=` differ between runs
(the tiny model is warm-started once, with the config's seed, and every run starts from it).
From each run's metrics.jsonl (rlvr/bench/run_metrics.py):
  - responses generated per step and per prompt (docs/ALGORITHMS.md 3.7: fresh responses only,
    every generated group counted, DAPO's filtered over-sampling included: the learner logs
    `gen/responses_per_step` over all groups generated for the step), whole-run mean and
    last-10% mean, and per prompt that reached the loss;
  - total generated responses and tokens;
  - responses generated until held-out eval/avg@8 first reaches a target (measured every
    `run.eval_every` steps, so the count is rounded up to the next evaluation);
  - final eval/avg@8 and eval/pass@8, and training wall time (mean and spread over seeds);
  - reduction factors: a baseline's responses per step / the algorithm's.
Besides the presets, `--algorithms` takes the variants in VARIANTS: `ar3po_abort` is AR3PO
with rollout.abort_on_first_correct on (the siblings of a first correct answer are aborted), so
`--algorithms ar3po,ar3po_abort --seeds 3` measures what that saves (tokens generated per
trained prompt, aborted partial responses included) and whether it costs accuracy.
Writes DIR/results.json, DIR/*.png and prints the tables.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.bench.common import (machine, names, markdown_table, run_overrides, shared_model,
                               targets_table, train_run, write_results)
from rlvr.bench.run_metrics import combine_seeds, default_target_acc, reductions, run_efficiency
from rlvr.bench.targets import efficiency_targets
from learner.run_log import read_metrics

ALGORITHMS = ("grpo", "dapo", "ar3po", "aero", "hora")
VARIANTS = {  # name -> (algorithm preset, overrides on top)
    "ar3po_abort": ("ar3po", ["rollout.abort_on_first_correct=true"]),
}


def run(config: str, out_dir: Path, overrides: list[str], steps: int | None, seeds: int,
        algorithms: tuple[str, ...] = ALGORITHMS, target_acc: float | None = None) -> dict:
    from protocol.config import load_config

    cfg = load_config(config, run_overrides(overrides, steps, []))  # fails before any run
    overrides = [*shared_model(cfg), *overrides]  # seeds vary the RL run, not the start model
    runs: dict[str, list[Path]] = {}
    launches: dict[str, list[dict]] = {}
    for name in algorithms:
        for seed in range(seeds):
            algorithm, extra = VARIANTS.get(name, (name, []))
            variant = [f"algorithm={algorithm}", *extra, f"run.seed={seed}"]
            run_dir, launch = train_run(config, out_dir, f"{name}-s{seed}",
                                        run_overrides(overrides, steps, variant))
            runs.setdefault(name, []).append(run_dir)
            launches.setdefault(name, []).append(launch)
    rows = {name: [read_metrics(d) for d in dirs] for name, dirs in runs.items()}
    results = summarize(rows, target_acc)
    results.update({
        "bench": "efficiency", "config": str(config), "overrides": overrides,
        "steps": cfg.run.steps, "prompts_per_step": cfg.rollout.prompts_per_step,
        "group_size": cfg.rollout.group_size, "seeds": seeds, "machine": machine(),
        "runs": {name: [str(d) for d in dirs] for name, dirs in runs.items()},
        "launches": launches,
    })
    from rlvr.bench.plots import plot_efficiency  # matplotlib: only when plotting

    results["plots"] = [str(p) for p in plot_efficiency(rows, results, out_dir)]
    write_results(out_dir, results)
    print(report(results))
    print(f"results: {out_dir / 'results.json'}")
    return results


def summarize(rows_by_algorithm: dict[str, list[list[dict]]], target_acc: float | None) -> dict:
    """results.json's numbers from the runs' metric rows (one list of rows per seed)."""
    untargeted = {name: combine_seeds([run_efficiency(r, None) for r in seeds])
                  for name, seeds in rows_by_algorithm.items()}
    rule = "given with --target-acc"
    if target_acc is None:
        target_acc = default_target_acc({n: a["eval_avg@8"]["mean"] for n, a in untargeted.items()})
        rule = "lowest mean final eval/avg@8 among the algorithms"
    algorithms = {name: combine_seeds([run_efficiency(r, target_acc) for r in seeds])
                  for name, seeds in rows_by_algorithm.items()}
    factors = reductions(algorithms)
    vs_dapo = factors.get("ar3po", {}).get("vs_dapo")
    return {
        "target_acc": target_acc, "target_acc_rule": rule,
        "algorithms": algorithms,
        "reductions": factors,
        "ar3po_reduction_vs_dapo": vs_dapo,
        "ar3po_reduction_vs_grpo": factors.get("ar3po", {}).get("vs_grpo"),
        "targets": efficiency_targets(algorithms, vs_dapo),
    }


def _pm(entry: dict, digits: int = 2) -> str:
    if not entry or entry.get("mean") is None:
        return "-"
    text = f"{entry['mean']:.{digits}f}"
    return text + (f" ± {entry['std']:.{digits}f}" if entry.get("n", 0) > 1 else "")


def report(results: dict) -> str:
    """Markdown tables: per-algorithm numbers, reduction factors, targets."""
    rows = []
    for name, a in results["algorithms"].items():
        f = results["reductions"].get(name, {})
        rows.append([name, _pm(a["responses_per_step"], 1), _pm(a["responses_per_prompt"]),
                     _pm(a["responses_per_trained_prompt"]), _pm(a["total_gen_tokens"], 0),
                     _pm(a.get("gen_tokens_per_trained_prompt"), 1),
                     f"{_pm(a['responses_to_target'], 0)} ({a['reached_target']}/{a['seeds']})",
                     _pm(a["eval_avg@8"], 3), _pm(a["eval_pass@8"], 3), _pm(a["wall_s"], 1),
                     f.get("vs_dapo"), f.get("vs_grpo")])
    table = markdown_table(
        ["algorithm", "responses/step", "resp/prompt", "resp/trained prompt", "gen tokens",
         "tokens/trained prompt",
         f"responses to avg@8 >= {results['target_acc'] or 0:.3f} (seeds)", "eval/avg@8",
         "eval/pass@8", "wall s", "x fewer than dapo", "x fewer than grpo"], rows)
    return f"{table}\n{targets_table(results['targets'])}"


# ---- the command line: `rlvr bench efficiency` (rlvr/bench/cli.py lists this module) ----

HELP = "responses generated and accuracy per algorithm"
NEEDS_CONFIG = True


def add_arguments(p) -> None:
    p.add_argument("--seeds", type=int, default=1, help="seeds per algorithm (run.seed 0..K-1)")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated")
    p.add_argument("--target-acc", type=float,
                   help="eval/avg@8 to count responses until (default: the lowest mean final "
                        "eval/avg@8 among the algorithms)")


def check(args) -> str | None:
    from protocol.config.presets import ALGORITHMS as PRESETS

    known = [*PRESETS, *VARIANTS]
    unknown = [a for a in names(args.algorithms) if a not in known]
    if unknown or not names(args.algorithms):
        return f"--algorithms: unknown {unknown}; choose from {known}"
    return "--seeds must be >= 1" if args.seeds < 1 else None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, overrides, args.steps, args.seeds, names(args.algorithms),
        args.target_acc)
