"""`rlvr bench throughput`: what asynchrony buys, against the most it could buy.

    rlvr bench throughput configs/tiny-cpu.yaml [--steps 100] [--out DIR] [a.b=v ...]

Trains the config's algorithm for the same number of steps in each schedule (`--modes`):
  sync       mode=sync (staleness 0: generate, then train)
  async_s1   mode=async max_staleness=1     (and async_s2, async_s4)
  staged     mode=staged (Mu-GRPO's schedule: stages of mugrpo.updates_per_stage steps sampled
             with the stage's weights; the algorithm's loss is kept, `algorithm=mugrpo` would
             also swap in Mu-GRPO's loss and fixed-N sampling)
The in-flight weight update policies (`actors.inflight_update`, docs/ARCHITECTURE.md "How data flows") and
AR3PO's abort on first correct are modes too, selected with `--modes`:
  async_s2_finish / async_s2_continue / async_s2_abort / async_s2_recompute
                                 max_staleness=2 and that policy
  async_s2_first_correct_abort   max_staleness=2 with rollout.abort_on_first_correct=true
Held-out evaluation during training is a mode too: async_s2_eval_learner and async_s2_eval_actors
evaluate every 5 steps (`run.eval_on` learner or actors), to set beside async_s2 (evaluation
only at the end); the targets then compare the actors' slowdown with the evaluation's share of
the tokens they generate (`eval/tokens` against the training responses' tokens), and the two
evaluation modes by steps/min with the evaluations' time included ("with eval": the learner's
evaluation pauses training; every other rate leaves evaluation out).
The table reports the learner's wait per weight sync (`sync/learner_wait_s`: from telling the
actors to sync to the last one holding the weights) side by side.
Evaluation runs only after the last step (run.eval_every = steps unless overridden). Numbers
come from each run's steady window (rlvr/bench/run_metrics.py): the first `--skip-first` steps
(default a tenth of the steps) are left out, because they fill the pipeline and async banks up
to max_staleness steps of groups in them, which a short window would count as speed; the last
step (final evaluation and checkpoint) is left out too. Reported: steps per minute, generated
and trained tokens/s, the learner's busy fraction (1 - its wait for groups / wall), the actors'
busy fraction (actor-seconds spent sampling the window's groups, `perf/actor_gen_s`, / wall x
actors.count), weight-sync seconds per step, the engines' fill (`gen/engine_fill`: busy rows
over row capacity while decoding, what a long tail empties), the share of generated responses
dropped as stale, and held-out accuracy at the end.

The overlap bound comes from the sync run itself: there a step is G (the learner waits while
the actors generate: `perf/learner_idle_s`) then T (the learner's own work: step time - wait),
each with the threads it also has in async (actors.threads, learner.threads). Perfect overlap
makes a step max(G, T), so async can at best be (G + T) / max(G, T) times faster than sync;
the bench reports that bound and async's measured speedup as a fraction of it. G measured this
way also holds what async hides besides generation (handing the work out, the actor loading
new weights), so on very short steps async can come out above the "bound".
"""

from __future__ import annotations

from pathlib import Path

from rlvr.bench.common import (machine, names, markdown_table, run_overrides, targets_table,
                               train_run, write_results)
from rlvr.bench.run_metrics import overlap_bound, ratio, run_throughput
from rlvr.bench.targets import throughput_targets
from learner.run_log import read_metrics

EVAL_EVERY = 5  # the evaluation modes: held-out evaluation this often, in the steady window
MODES = {
    "sync": ["mode=sync"],
    "async_s1": ["mode=async", "max_staleness=1"],
    "async_s2": ["mode=async", "max_staleness=2"],
    "async_s4": ["mode=async", "max_staleness=4"],
    "staged": ["mode=staged"],
    "async_s2_finish": ["mode=async", "max_staleness=2", "actors.inflight_update=finish"],
    "async_s2_continue": ["mode=async", "max_staleness=2", "actors.inflight_update=continue"],
    "async_s2_abort": ["mode=async", "max_staleness=2", "actors.inflight_update=abort"],
    "async_s2_recompute": ["mode=async", "max_staleness=2", "actors.inflight_update=recompute"],
    "async_s2_first_correct_abort": ["mode=async", "max_staleness=2",
                                     "rollout.abort_on_first_correct=true"],
    "async_s2_eval_learner": ["mode=async", "max_staleness=2", f"run.eval_every={EVAL_EVERY}",
                              "run.eval_on=learner"],
    "async_s2_eval_actors": ["mode=async", "max_staleness=2", f"run.eval_every={EVAL_EVERY}",
                             "run.eval_on=actors"],
}
DEFAULT_MODES = ("sync", "async_s1", "async_s2", "async_s4", "staged")
EVAL_MODES = ("sync", "async_s2", "async_s2_eval_learner", "async_s2_eval_actors")
INFLIGHT_MODES = ("sync", "async_s2_finish", "async_s2_continue", "async_s2_abort",
                  "async_s2_recompute")
ASYNC_MODE = "async_s2"  # the one the speedup and the targets are about
DEFAULT_ASYNC_TWIN = "async_s2_finish"  # the same schedule: finish is the default policy


def run(config: str, out_dir: Path, overrides: list[str], steps: int | None,
        modes: tuple[str, ...] = DEFAULT_MODES, skip_first: int | None = None) -> dict:
    from protocol.config import load_config

    cfg = load_config(config, run_overrides(overrides, steps, []))
    if skip_first is None:  # async starts with up to max_staleness steps of groups banked
        skip_first = max(1, cfg.run.steps // 10)
    # evaluate once, at the end, unless the user asked otherwise (their override comes later)
    base = [f"run.eval_every={cfg.run.steps}", *overrides]
    runs, launches = {}, {}
    for mode in modes:
        runs[mode], launches[mode] = train_run(config, out_dir, mode,
                                               run_overrides(base, steps, MODES[mode]))
    rows = {mode: read_metrics(d) for mode, d in runs.items()}
    results = summarize(rows, cfg.actors.count, skip_first)
    results.update({
        "bench": "throughput", "config": str(config), "overrides": overrides,
        "steps": cfg.run.steps, "algorithm": cfg.algorithm, "actors": cfg.actors.count,
        "threads": {"actor": cfg.actors.threads, "learner": cfg.learner.threads},
        "skip_first_steps": skip_first, "machine": machine(),
        "runs": {m: str(d) for m, d in runs.items()}, "launches": launches,
    })
    from rlvr.bench.plots import plot_throughput  # matplotlib: only when plotting

    results["plots"] = [str(p) for p in plot_throughput(results, out_dir)]
    write_results(out_dir, results)
    print(report(results))
    print(f"results: {out_dir / 'results.json'}")
    return results


def summarize(rows_by_mode: dict[str, list[dict]], actors: int, skip_first: int = 1) -> dict:
    modes = {m: run_throughput(rows, actors, skip_first) for m, rows in rows_by_mode.items()}
    bound = overlap_bound(modes["sync"]) if "sync" in modes else overlap_bound({})
    sync_rate = modes.get("sync", {}).get("steps_per_min")
    for m in modes.values():
        m["speedup_vs_sync"] = ratio(m["steps_per_min"], sync_rate)
        m["fraction_of_overlap_bound"] = ratio(m["speedup_vs_sync"], bound["bound"])
    async_mode = ASYNC_MODE if ASYNC_MODE in modes or DEFAULT_ASYNC_TWIN not in modes \
        else DEFAULT_ASYNC_TWIN  # `--modes` of the in-flight policies: the default is finish
    speedup = modes.get(async_mode, {}).get("speedup_vs_sync")
    return {
        "modes": modes,
        "speedup_async_vs_sync": speedup,
        "async_mode": async_mode,
        "overlap_bound": bound["bound"],
        "overlap": bound,
        "async_fraction_of_bound": ratio(speedup, bound["bound"]),
        "targets": throughput_targets(modes, bound["bound"], async_mode),
    }


def report(results: dict) -> str:
    rows = [[mode, m["steps_per_min"], m.get("steps_per_min_with_eval"), m["speedup_vs_sync"], m["fraction_of_overlap_bound"],
             m["gen_tokens_per_s"], m["train_tokens_per_s"], m["learner_busy_frac"],
             m["actor_busy_frac"], m["sync_s_per_step"], _ms(m.get("learner_wait_s_per_sync")),
             m.get("gen_tokens_per_trained_prompt"), m.get("aborted_tokens_per_step"),
             m.get("engine_fill"), m.get("dropped_frac"), m["stale_max"],
             m.get("version_spread_max"), m["eval_avg@8"], m.get("eval_pass@8")]
            for mode, m in results["modes"].items()]
    table = markdown_table(["mode", "steps/min", "with eval", "x sync", "of bound", "gen tok/s",
                            "train tok/s", "learner busy", "actor busy", "sync s/step",
                            "learner wait ms/sync", "tok/trained prompt", "aborted tok/step",
                            "engine fill", "dropped", "stale max", "versions in a response",
                            "eval/avg@8", "eval/pass@8"], rows)
    tail = markdown_table(
        ["mode", "responses", "len p50", "len p90", "len p99", "len max",
         "p90/step generated", "p90/step trained", "later stage generated", "later stage trained"],
        [[mode, *_quantiles(m.get("len_generated")), m.get("len_generated_p90"),
          m.get("len_trained_p90"), m.get("later_stage_frac"), m.get("later_stage_frac_trained")]
         for mode, m in results["modes"].items()])
    o = results["overlap"]
    bound = (f"sync run: G (generation, learner waits) = {_s(o['G_s'])} s/step, "
             f"T (learner work) = {_s(o['T_s'])} s/step; overlap bound (G+T)/max(G,T) = "
             f"{_s(o['bound'])}x; {results['async_mode']} reached "
             f"{_s(results['speedup_async_vs_sync'])}x = {_s(results['async_fraction_of_bound'])} "
             f"of the bound\n")
    return (f"{table}\n{bound}\nGenerated response lengths in the window (tokens), and what "
            f"training kept:\n{tail}\n{targets_table(results['targets'])}")


def _quantiles(q: dict | None) -> list:
    return [None] * 5 if q is None else [q["n"], q["p50"], q["p90"], q["p99"], q["max"]]


def _ms(value) -> float | None:
    return None if value is None else 1000.0 * value


def _s(value) -> str:
    return "-" if value is None else f"{value:.3f}"


# ---- the command line: `rlvr bench throughput` (rlvr/bench/cli.py lists this module) ----

HELP = "sync vs async vs staged steps/min and the overlap bound"
NEEDS_CONFIG = True


def add_arguments(p) -> None:
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated of {list(MODES)}")
    p.add_argument("--skip-first", type=int,
                   help="steps left out at the start of the steady window (default steps/10)")


def check(args) -> str | None:
    unknown = [m for m in names(args.modes) if m not in MODES]
    if unknown or not names(args.modes):
        return f"--modes: unknown {unknown}; choose from {list(MODES)}"
    return None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, overrides, args.steps, names(args.modes), args.skip_first)
