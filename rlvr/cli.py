"""The `rlvr` command.

    rlvr train CONFIG [a.b=value ...] [--dry-run]     train (learner + actors on this machine)
    rlvr train --resume runs/NAME                     continue a run from its last checkpoint
    rlvr train CONFIG --describe                      every config key with its type and doc
    rlvr compare runs/A runs/B [--out DIR]            tables and PNG plots from run folders
    rlvr sweep CONFIG key=v1,v2 [key=...] [--seeds K] [--slurm --nodes N ...] [--wait] [--out DIR]
    rlvr sweep --status [--out DIR]                   which runs of a sweep are done
    rlvr eval RUN_DIR|MODEL_DIR [--config C] [--samples K] [--engine hf|vllm] [--step N]
                                                      held-out avg@k, pass@k, greedy per level
    rlvr plan RUN_DIR [--actors 1,2,4] [--learner-ranks 1,2] [--max-staleness 0,1,2,4] [--gpus N]
                                                      predicted steps/min of cluster splits
    rlvr plot runs/NAME                               (re)draw a run's PNG plots
    rlvr slurm submit CONFIG [a.b=value ...] --nodes N [--actors-per-node A] [--hetjob] [--dry-run]
    rlvr slurm status JOBID                           job state and progress from the run folder
    rlvr keys DIR [--force]                           CurveZMQ keys for a non-loopback learner
    rlvr data check CONFIG [a.b=value ...]            the task's rows and model folder, no run
    rlvr bench efficiency CONFIG [--seeds K] [--steps N] [--out DIR] [a.b=value ...]
    rlvr bench throughput CONFIG [--steps N] [--out DIR] [a.b=value ...]
    rlvr bench weights|transport [CONFIG] [--out DIR] [a.b=value ...]
                                                      benchmarks -> DIR/results.json (BENCHMARKS.md)
"""

from __future__ import annotations

import argparse
import sys


def _train(args) -> int:
    from protocol.config import Config
    from protocol.config.loader import describe

    if args.describe:
        print(describe(Config))
        return 0
    if not args.config and not args.resume:
        raise SystemExit("rlvr train: give a CONFIG path, or --resume RUN_DIR")
    from rlvr.launch import train

    return train(args.config, args.overrides, args.resume, args.dry_run)


def _compare(args) -> int:
    from rlvr.compare import compare_runs

    table, pngs = compare_runs(args.runs, args.out)
    print(table)
    for p in pngs:
        print(p)
    return 0


def _plot(args) -> int:
    from learner.plots import plot_run

    for p in plot_run(args.run):
        print(p)
    return 0


def _keys(args) -> int:
    from protocol.keys import KeysError, make_keys

    try:
        paths = make_keys(args.dir, force=args.force)
    except KeysError as e:
        print(f"rlvr keys: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    d = args.dir
    print(f"learner host: keep {d}/learner.key_secret and {d}/actor.key (the allowed actors).\n"
          f"actor hosts: copy {d}/actor.key_secret and {d}/learner.key into a folder there.\n"
          f"Pass that folder as the key folder (curve_dir) on both sides; secret files stay 0600.")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlvr", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train (learner + actors)")
    t.add_argument("config", nargs="?", help="YAML config, e.g. configs/tiny-cpu.yaml")
    t.add_argument("overrides", nargs="*", help="dotted overrides a.b=value")
    t.add_argument("--resume", metavar="RUN_DIR", help="resume the run in RUN_DIR")
    t.add_argument("--dry-run", action="store_true", help="validate and print the resolved config")
    t.add_argument("--describe", action="store_true", help="list every config key")
    t.set_defaults(func=_train)

    c = sub.add_parser("compare", help="compare run folders")
    c.add_argument("runs", nargs="+")
    c.add_argument("--out", default="runs/compare")
    c.set_defaults(func=_compare)

    from slurm.submit import add_cli as add_slurm_cli

    add_slurm_cli(sub)  # rlvr slurm submit|status

    p = sub.add_parser("plot", help="draw a run's plots")
    p.add_argument("run")
    p.set_defaults(func=_plot)

    k = sub.add_parser("keys", help="make CurveZMQ keys (needed to bind beyond loopback)")
    k.add_argument("dir", help="folder to write the learner and actor keypairs into")
    k.add_argument("--force", action="store_true", help="replace keys already in DIR")
    k.set_defaults(func=_keys)

    from rlvr.data_check import add_cli as add_data_cli

    add_data_cli(sub)  # rlvr data check CONFIG

    from rlvr.bench.cli import add_cli as add_bench_cli

    add_bench_cli(sub)  # rlvr bench efficiency|throughput|weights|transport|memory|plan|generation|realshape

    from rlvr.plan.report import add_cli as add_plan_cli
    from rlvr.sweep import add_cli as add_sweep_cli

    add_plan_cli(sub)  # rlvr plan RUN_DIR
    from rlvr.eval import add_cli as add_eval_cli

    add_eval_cli(sub)  # rlvr eval RUN_DIR|MODEL_DIR
    from rlvr.export import add_cli as add_export_cli

    add_export_cli(sub)  # rlvr export RUN_DIR OUT [--merge]
    add_sweep_cli(sub)  # rlvr sweep CONFIG key=v1,v2 ... [--slurm ...] | --status
    return ap


def main(argv: list[str] | None = None) -> int:
    from protocol.config.loader import ConfigError

    args, extra = parser().parse_known_args(argv)
    # overrides may come after options (`rlvr train C --dry-run a.b=1`): keep the dotted ones
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    if bad:
        parser().error(f"unrecognized arguments: {' '.join(bad)}")
    if extra:
        args.overrides = list(getattr(args, "overrides", [])) + extra
    # `rlvr train --resume D a.b=1`: argparse puts the first override in `config`
    if getattr(args, "resume", None) and args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"rlvr: config error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
