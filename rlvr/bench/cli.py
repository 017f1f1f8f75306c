"""`rlvr bench KIND ...`: the command line of the benchmarks (wired into rlvr/cli.py).

A bench is one module of this package listed in BENCHES. It holds its measurement and its command
line: `HELP`, `NEEDS_CONFIG` (True: a CONFIG argument; False: an optional one; None: no config
and no run options), `add_arguments(parser)` for its own flags, `check(args)` (the refusal of a
bad value, or None; run before anything starts) and `main(args, out, overrides)`.
Every bench with a config takes [CONFIG] [a.b=value ...] [--steps N] [--out DIR (default
runs/bench/<kind>)]; `rlvr bench KIND --help` lists the rest.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHES = ("efficiency", "throughput", "weights", "transport", "memory", "plan", "staleness",
           "generation", "realshape")


def _module(kind: str):
    return importlib.import_module(f"rlvr.bench.{kind}")


def bench(args) -> int:
    """Run the benchmark `args.kind`; 1 when a run failed or a run folder is in the way."""
    from rlvr.bench.common import BenchError

    # `rlvr bench weights a.b=1`: with CONFIG optional, argparse takes the override for it
    if args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    module = _module(args.kind)
    if problem := module.check(args):
        raise SystemExit(f"rlvr bench {args.kind}: {problem}")
    try:
        module.main(args, Path(args.out or f"runs/bench/{args.kind}"), list(args.overrides))
    except BenchError as e:
        print(f"rlvr bench: {e}", file=sys.stderr)
        return 1
    return 0


def add_cli(sub) -> None:
    """Add `bench` and its kinds to the `rlvr` subcommands (without importing torch: every
    `rlvr` command builds this parser, and `rlvr train` starts its processes after it)."""
    b = sub.add_parser("bench", help=f"benchmarks: {', '.join(BENCHES)}")
    kinds = b.add_subparsers(dest="kind", required=True)
    for kind in BENCHES:
        module = _module(kind)
        k = kinds.add_parser(kind, help=module.HELP)
        if module.NEEDS_CONFIG is None:
            k.set_defaults(config=None, overrides=[], steps=None)
        else:
            k.add_argument("config", nargs=None if module.NEEDS_CONFIG else "?",
                           help="YAML config, e.g. configs/tiny-cpu.yaml")
            k.add_argument("overrides", nargs="*", help="dotted overrides a.b=value for every run")
            k.add_argument("--steps", type=int, help="override run.steps")
        k.add_argument("--out", help=f"output folder (default runs/bench/{kind})")
        module.add_arguments(k)
        k.set_defaults(func=bench)
