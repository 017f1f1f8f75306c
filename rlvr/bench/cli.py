"""`rlvr bench ...`: the command line of the benchmarks (wired into rlvr/cli.py).

    rlvr bench efficiency CONFIG [--seeds K] [--algorithms a,b] [--target-acc X]
    rlvr bench throughput CONFIG [--modes sync,async_s2,...] [--skip-first S]
    rlvr bench weights [CONFIG] [--big-mb 64,256] [--rounds 5] [--receivers N]
    rlvr bench transport [CONFIG] [--messages 2000] [--step-s S]
    rlvr bench plan CONFIG [--staleness 0,1,2,4]     the planner's predictions against real runs
    rlvr bench staleness CONFIG [--inject 0,4,16,64] [--objectives naive,decoupled,mugrpo,m2po]
                         [--seeds 3]               final accuracy against injected staleness
    rlvr bench generation [CONFIG] [--models tiny,real-shape] [--engines hf,vllm] [--prompts P]
                          [--samples N] [--tokens T] [--rounds R]
    rlvr bench realshape [CONFIG (default configs/real-shape-cpu.yaml)]
each with [--steps N] [--out DIR (default runs/bench/<kind>)] [a.b=value ...], and
    rlvr bench memory [--tokens 1024,4096,8192] [--seq-len 1024] [--vocab 151936] [--chunk-mb M]
                      [--out DIR]   (one micro-batch of a model it builds: no config, no run).
Names are checked before any run starts; the benches themselves are in this package.
"""

from __future__ import annotations

import sys
from pathlib import Path


def bench(args) -> int:
    """Run the benchmark `args.kind`; 1 when a run failed or a run folder is in the way."""
    from rlvr.bench.common import BenchError

    # `rlvr bench weights a.b=1`: with CONFIG optional, argparse takes the override for it
    if args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    _check_bench_args(args)
    out = Path(args.out or f"runs/bench/{args.kind}")
    overrides = list(args.overrides)
    try:
        match args.kind:
            case "efficiency":
                from rlvr.bench import efficiency

                efficiency.run(args.config, out, overrides, args.steps, args.seeds,
                               _names(args.algorithms), args.target_acc)
            case "throughput":
                from rlvr.bench import throughput

                throughput.run(args.config, out, overrides, args.steps, _names(args.modes),
                               args.skip_first)
            case "weights":
                from rlvr.bench import weights

                weights.run(args.config, out, _with_steps(overrides, args.steps),
                            [int(mb) for mb in _names(args.big_mb) if int(mb) > 0], args.rounds,
                            args.receivers)
            case "transport":
                from rlvr.bench import transport

                transport.run(args.config, out, _with_steps(overrides, args.steps),
                              args.messages, args.step_s)
            case "memory":
                from learner.logprobs import CHUNK_LOGITS_BYTES
                from rlvr.bench import memory

                chunk_mb = args.chunk_mb if args.chunk_mb is not None else CHUNK_LOGITS_BYTES >> 20
                memory.run(out, [int(t) for t in _names(args.tokens)], args.seq_len, args.vocab,
                           args.hidden, args.layers, chunk_mb)
            case "plan":
                from rlvr.bench import plan

                plan.run(args.config, out, overrides, args.steps,
                         tuple(int(s) for s in _names(args.staleness)))
            case "generation":
                from rlvr.bench import generation

                generation.run(args.config, out, _with_steps(overrides, args.steps),
                               _names(args.models), _names(args.engines), args.prompts,
                               args.samples, args.tokens, args.rounds)
            case "staleness":
                from rlvr.bench import staleness

                staleness.run(args.config, out, overrides, args.steps,
                              [int(k) for k in _names(args.inject)], list(_names(args.objectives)),
                              args.seeds)
            case "realshape":
                from rlvr.bench import realshape

                realshape.run(args.config, out, overrides, args.steps)
    except BenchError as e:
        print(f"rlvr bench: {e}", file=sys.stderr)
        return 1
    return 0


def _check_bench_args(args) -> None:
    """Refuse unknown algorithm and mode names and empty sweeps before any run starts."""
    from rlvr.bench.efficiency import VARIANTS
    from rlvr.bench.throughput import MODES
    from protocol.presets import ALGORITHMS

    def refuse(what: str) -> None:
        raise SystemExit(f"rlvr bench {args.kind}: {what}")

    if args.kind == "efficiency":
        known = [*ALGORITHMS, *VARIANTS]
        unknown = [a for a in _names(args.algorithms) if a not in known]
        if unknown or not _names(args.algorithms):
            refuse(f"--algorithms: unknown {unknown}; choose from {known}")
        if args.seeds < 1:
            refuse("--seeds must be >= 1")
    if args.kind == "throughput":
        unknown = [m for m in _names(args.modes) if m not in MODES]
        if unknown or not _names(args.modes):
            refuse(f"--modes: unknown {unknown}; choose from {list(MODES)}")
    if args.kind == "staleness":
        from rlvr.bench.staleness import OBJECTIVES

        unknown = [o for o in _names(args.objectives) if o not in OBJECTIVES]
        if unknown or not _names(args.objectives):
            refuse(f"--objectives: unknown {unknown}; choose from {list(OBJECTIVES)}")
        if not all(k.isdigit() for k in _names(args.inject)) or not _names(args.inject):
            refuse(f"--inject: staleness values >= 0, comma-separated, not {args.inject!r}")
        if args.seeds < 1:
            refuse("--seeds must be >= 1")
    if args.kind == "plan":
        if not all(s.isdigit() for s in _names(args.staleness)) or not _names(args.staleness):
            refuse(f"--staleness: bounds >= 0, comma-separated, not {args.staleness!r}")
    if args.kind == "generation":
        from rlvr.bench.generation import ENGINES, MODELS

        for flag, given, known in [("--models", args.models, MODELS),
                                   ("--engines", args.engines, ENGINES)]:
            unknown = [n for n in _names(given) if n not in known]
            if unknown or not _names(given):
                refuse(f"{flag}: unknown {unknown}; choose from {list(known)}")
        for flag in ("prompts", "samples", "tokens", "rounds"):
            if getattr(args, flag) < 1:
                refuse(f"--{flag} must be >= 1")
    if args.kind == "weights":
        if args.rounds < 1:
            refuse("--rounds must be >= 1")
        if not all(mb.isdigit() for mb in _names(args.big_mb)):
            refuse(f"--big-mb: sizes in whole MB, comma-separated, not {args.big_mb!r}")
    if args.kind == "memory":
        tokens = _names(args.tokens)
        if not tokens or not all(t.isdigit() and int(t) > 0 for t in tokens):
            refuse(f"--tokens: positive whole numbers, comma-separated, not {args.tokens!r}")
        if args.seq_len <= 64 or any(int(t) % args.seq_len for t in tokens):
            refuse("--seq-len must exceed the 64-token prompt and divide every --tokens value")
        chunk_mb = 1 if args.chunk_mb is None else args.chunk_mb  # None: the learner's
        if min(args.vocab, args.hidden, args.layers, chunk_mb) < 1:
            refuse("--vocab, --hidden, --layers and --chunk-mb must be >= 1")


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _with_steps(overrides: list[str], steps: int | None) -> list[str]:
    return [*overrides, f"run.steps={steps}"] if steps else overrides


def add_cli(sub) -> None:
    """Add `bench` and its kinds to the `rlvr` subcommands (without importing torch: every
    `rlvr` command builds this parser, and `rlvr train` starts its processes after it)."""
    from rlvr.bench.efficiency import ALGORITHMS as BENCHED
    from rlvr.bench.throughput import DEFAULT_MODES, MODES

    b = sub.add_parser("bench", help="benchmarks: efficiency, throughput, weights, transport, "
                                     "memory, plan, staleness, generation, realshape")
    kinds = b.add_subparsers(dest="kind", required=True)
    for kind, needs_config, what in [
            ("efficiency", True, "responses generated and accuracy per algorithm"),
            ("throughput", True, "sync vs async vs staged steps/min and the overlap bound"),
            ("weights", False, "weight broadcast bandwidth vs a memory copy"),
            ("transport", False, "ZeroMQ + codec messages/s and their share of a step"),
            ("plan", True, "rlvr plan's predicted steps/min against measured runs"),
            ("staleness", True, "final accuracy against injected staleness per objective"),
            ("generation", False, "HF vs vLLM generation tokens/s and weight update time"),
            ("realshape", False, "a few RL steps of a Qwen2.5-0.5B-shaped model: step and "
                                 "sync time, peak memory per process")]:
        k = kinds.add_parser(kind, help=what)
        k.add_argument("config", nargs=None if needs_config else "?",
                       help="YAML config, e.g. configs/tiny-cpu.yaml")
        k.add_argument("overrides", nargs="*", help="dotted overrides a.b=value for every run")
        k.add_argument("--steps", type=int, help="override run.steps")
        k.add_argument("--out", help=f"output folder (default runs/bench/{kind})")
        k.set_defaults(func=bench)
    e = kinds.choices["efficiency"]
    e.add_argument("--seeds", type=int, default=1, help="seeds per algorithm (run.seed 0..K-1)")
    e.add_argument("--algorithms", default=",".join(BENCHED), help="comma-separated")
    e.add_argument("--target-acc", type=float,
                   help="eval/avg@8 to count responses until (default: the lowest mean final "
                        "eval/avg@8 among the algorithms)")
    t = kinds.choices["throughput"]
    t.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated of {list(MODES)}")
    t.add_argument("--skip-first", type=int,
                   help="steps left out at the start of the steady window (default steps/10)")
    w = kinds.choices["weights"]
    w.add_argument("--big-mb", default="64,256",
                   help="flat buffer sizes in MB, comma-separated (0 or empty: model only)")
    w.add_argument("--rounds", type=int, default=5, help="broadcasts per payload (first = warm-up)")
    w.add_argument("--receivers", type=int, help="receiver processes (default actors.count)")
    p = kinds.choices["plan"]
    p.add_argument("--staleness", default="0,1,2,4",
                   help="async runs' max_staleness values, comma-separated (the sync run is "
                        "always trained: it is the measurement)")
    st = kinds.choices["staleness"]
    st.add_argument("--inject", default="0,4,16,64",
                    help="injected staleness values K (stale_inject), comma-separated")
    st.add_argument("--objectives", default="naive,decoupled,mugrpo,m2po",
                    help="comma-separated of naive, decoupled, mugrpo, m2po")
    st.add_argument("--seeds", type=int, default=3, help="seeds per cell (run.seed 0..K-1)")
    g = kinds.choices["generation"]
    g.add_argument("--models", default="tiny,real-shape", help="comma-separated: tiny, real-shape")
    g.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    g.add_argument("--prompts", type=int, default=32, help="prompts per generate call")
    g.add_argument("--samples", type=int, default=8, help="responses per prompt")
    g.add_argument("--tokens", type=int, default=32, help="max new tokens per response")
    g.add_argument("--rounds", type=int, default=3, help="timed calls (after one warm-up)")
    x = kinds.choices["transport"]
    x.add_argument("--messages", type=int, default=2000, help="Group messages to send")
    x.add_argument("--step-s", type=float,
                   help="learner step seconds to compare with (default: measure policy_update)")
    mem = kinds.add_parser("memory", help="peak learner memory of one micro-batch: full logits "
                                          "vs chunked log-probs")
    mem.add_argument("--tokens", default="1024,4096,8192",
                     help="micro-batch sizes in tokens, comma-separated")
    mem.add_argument("--seq-len", type=int, default=1024, help="tokens per row")
    mem.add_argument("--vocab", type=int, default=151_936, help="vocabulary (Qwen2.5's)")
    mem.add_argument("--hidden", type=int, default=256, help="hidden size")
    mem.add_argument("--layers", type=int, default=2, help="transformer layers")
    mem.add_argument("--chunk-mb", type=int, default=None,
                     help="float32 logits per chunk in MB (default: the learner's)")
    mem.add_argument("--out", help="output folder (default runs/bench/memory)")
    mem.set_defaults(func=bench, config=None, overrides=[], steps=None)
