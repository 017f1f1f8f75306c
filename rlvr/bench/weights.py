"""`rlvr bench weights`: weight-broadcast bandwidth against a plain memory copy.

    rlvr bench weights [CONFIG] [--out DIR] [--big-mb 64,256] [--rounds 5] [--receivers N]

The learner side (this process, rank 0) broadcasts with `protocol.weights.WeightGroup` over gloo
to `--receivers` real processes (default actors.count), exactly as a weight sync does: header,
verdict all-gather, flat buckets of weight_sync.bucket_mb. Payloads:
  model       the config's model's parameters (the tiny model's layout when model.path is
              empty), many tensors of mixed sizes cut into buckets;
  flat_<N>mb  one N MB float32 buffer per `--big-mb` entry (one big tensor per bucket).
A round's time runs from rank 0 entering `send` to the last receiver leaving `receive` (all on
this machine, so the clocks agree), i.e. the whole hand-over including the receivers' copy
into their parameters; rank 0 waits for every receiver's word before the next round so rounds
never overlap. The first round is warm-up (connection, first touch of the pages) and left out.
The baseline is `torch.Tensor.copy_` of the same number of bytes in one process with
learner.threads threads. Bandwidth ratio = broadcast GB/s / copy GB/s (target >= 0.5).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from rlvr.bench.common import (machine, markdown_table, names, targets_table, with_steps,
                               write_results)
from rlvr.bench.run_metrics import gb_per_s, ratio, timed_rounds
from rlvr.bench.targets import target

HOST = "127.0.0.1"


def model_layout(cfg) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of the parameters the learner would broadcast, without weights:
    the model is built on the meta device; the dtype is the learner's (float32, bf16 with
    optim.bf16)."""
    import torch

    with torch.device("meta"):
        if cfg.model.path:
            from transformers import AutoConfig, AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.model.path))
        else:
            from tasks.tiny_model import build_model, build_tokenizer

            m = cfg.model
            model = build_model(build_tokenizer(), m.hidden, m.layers, m.heads, m.ffn)
    dtype = "bfloat16" if cfg.optim.bf16 else "float32"
    return [(n, tuple(p.shape), dtype) for n, p in model.named_parameters()]


def _materialize(layout, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [(n, torch.randn(shape, generator=g).to(getattr(torch, dtype)))
            for n, shape, dtype in layout]


def _nbytes(layout) -> int:
    import math

    sizes = {"float32": 4, "bfloat16": 2, "float16": 2}
    return sum(math.prod(shape) * sizes[dtype] for _, shape, dtype in layout)


def _receiver(port: int, rank: int, world: int, payloads, rounds: int, bucket_bytes: int,
              threads: int, timeout_s: float, acks) -> None:
    """Ranks 1..R: receive every payload `rounds` times; report each round's end time."""
    import torch

    from protocol.weights import WeightGroup

    torch.set_num_threads(threads)
    try:
        with WeightGroup.create(HOST, port, rank, world, timeout_s) as group:
            for _, layout in payloads:
                params = _materialize(layout, seed=rank)
                for _ in range(rounds):
                    group.receive(params, bucket_bytes)
                    acks.put(("ok", rank, time.time()))
    except Exception as e:  # noqa: BLE001 - reported by rank 0, which would otherwise hang
        acks.put(("error", rank, repr(e)))


def _broadcast_times(payloads, receivers: int, rounds: int, bucket_bytes: int, threads: int,
                     timeout_s: float) -> dict[str, list[float]]:
    from rlvr.launch import free_port
    from protocol.weights import WeightGroup

    ctx = mp.get_context("spawn")
    acks, port, world = ctx.Queue(), free_port(), receivers + 1
    procs = [ctx.Process(target=_receiver, daemon=True,
                         args=(port, r, world, payloads, rounds, bucket_bytes, threads,
                               timeout_s, acks)) for r in range(1, world)]
    for p in procs:
        p.start()
    times: dict[str, list[float]] = {}
    try:
        with WeightGroup.create(HOST, port, 0, world, timeout_s) as group:
            for name, layout in payloads:
                params = _materialize(layout, seed=0)
                for _ in range(rounds):
                    t0 = time.time()
                    group.send(params, bucket_bytes)
                    ends = [_ack(acks, timeout_s) for _ in range(receivers)]
                    times.setdefault(name, []).append(max(ends) - t0)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return times


def _ack(acks, timeout_s: float) -> float:
    status, rank, value = acks.get(timeout=timeout_s)
    if status != "ok":
        raise RuntimeError(f"weights bench: receiver rank {rank} failed: {value}")
    return value


def copy_times(nbytes: int, rounds: int) -> list[float]:
    """Seconds of `copy_` of `nbytes` between two preallocated buffers, per round."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return times


def run(config: str | None, out_dir: Path, overrides: list[str], big_mb: list[int],
        rounds: int, receivers: int | None) -> dict:
    import torch

    from protocol.config import Config, with_overrides, load_config

    cfg = load_config(config, overrides) if config else with_overrides(Config(), overrides)
    receivers = receivers or cfg.actors.count
    torch.set_num_threads(cfg.learner.threads)
    payloads = [("model", model_layout(cfg))]
    payloads += [(f"flat_{mb}mb", [("flat", ((mb << 20) // 4,), "float32")]) for mb in big_mb]
    bucket_bytes = cfg.weight_sync.bucket_mb << 20
    broadcast = _broadcast_times(payloads, receivers, rounds, bucket_bytes,
                                 cfg.actors.threads, cfg.weight_sync.timeout_s)
    cases = {}
    for name, layout in payloads:
        nbytes = _nbytes(layout)
        b, c = timed_rounds(broadcast[name]), timed_rounds(copy_times(nbytes, rounds))
        bw, copy_bw = gb_per_s(nbytes, b["median_s"]), gb_per_s(nbytes, c["median_s"])
        cases[name] = {"bytes": nbytes, "tensors": len(layout), "broadcast": b, "copy": c,
                       "broadcast_gb_per_s": bw, "copy_gb_per_s": copy_bw,
                       "ratio_to_copy": ratio(bw, copy_bw)}
    biggest = f"flat_{max(big_mb)}mb" if big_mb else "model"
    results = {
        "bench": "weights", "config": config, "overrides": overrides, "backend": "gloo",
        "receivers": receivers, "rounds": rounds, "bucket_mb": cfg.weight_sync.bucket_mb,
        "threads": {"sender_and_copy": cfg.learner.threads, "receiver": cfg.actors.threads},
        "cases": cases, "machine": machine(),
        "targets": {f"broadcast_half_of_copy_{name}": target(
            f"{name}: broadcast GB/s / copy GB/s >= 0.5", cases[name]["ratio_to_copy"], ">=", 0.5)
            for name in dict.fromkeys(["model", biggest])},
    }
    write_results(out_dir, results)
    print(report(results))
    print(f"results: {out_dir / 'results.json'}")
    return results


def report(results: dict) -> str:
    rows = [[name, f"{c['bytes'] / 2**20:.1f}", c["tensors"], c["broadcast"]["median_s"] * 1e3,
             c["broadcast_gb_per_s"], c["copy_gb_per_s"], c["ratio_to_copy"]]
            for name, c in results["cases"].items()]
    table = markdown_table(["payload", "MiB", "tensors", "broadcast ms (median)",
                            "broadcast GB/s", "copy GB/s", "broadcast / copy"], rows)
    return f"{table}\n{targets_table(results['targets'])}"


# ---- the command line: `rlvr bench weights` (rlvr/bench/cli.py lists this module) ----

HELP = "weight broadcast bandwidth vs a memory copy"
NEEDS_CONFIG = False


def add_arguments(p) -> None:
    p.add_argument("--big-mb", default="64,256",
                   help="flat buffer sizes in MB, comma-separated (0 or empty: model only)")
    p.add_argument("--rounds", type=int, default=5, help="broadcasts per payload (first = warm-up)")
    p.add_argument("--receivers", type=int, help="receiver processes (default actors.count)")


def check(args) -> str | None:
    if args.rounds < 1:
        return "--rounds must be >= 1"
    if not all(mb.isdigit() for mb in names(args.big_mb)):
        return f"--big-mb: sizes in whole MB, comma-separated, not {args.big_mb!r}"
    return None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, with_steps(overrides, args.steps),
        [int(mb) for mb in names(args.big_mb) if int(mb) > 0], args.rounds, args.receivers)
