"""`rlvr bench generation`: the HF and vLLM engines side by side, generation tokens/s and weight
update time, on the tiny model and on a model of Qwen2.5-0.5B's shape.

    rlvr bench generation [CONFIG] [--models tiny,real-shape] [--engines hf,vllm]
                          [--prompts 32] [--samples 8] [--tokens 32] [--rounds 3] [--out DIR]

Each (model, engine) pair runs in its own process (`python -m rlvr.bench.generation PAIR_JSON`),
one after the other, with actors.threads torch threads: load the engine, one full-size warm-up
call, then `--rounds` timed `generate` calls of `--prompts` arithmetic prompts x `--samples`
responses of at most `--tokens` new tokens at temperature 1 (each engine stops a response at
eos, so both count the tokens they really generated; the same model gives both the same
distribution). Then the weight update an actor does after a broadcast, timed `--rounds` times:
copy a new set of weights into `weight_targets()` and `commit_weights()` (HF: the copy is the
update; vLLM: the copy into its staging tensors, then `reload_weights`). The broadcast itself is
the same for both engines and measured by `rlvr bench weights`.

Models: `tiny` is the config's warm-started tiny model (float32), `real-shape` the random
Qwen2.5-0.5B-shaped model of rlvr/real_shape.py (bf16, as vLLM serves it). vLLM runs with the
config's actors.* settings (actors.kv_cache_gib, default 1 GiB here; actors.enforce_eager).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rlvr.bench.common import BenchError, machine, markdown_table, names, with_steps, write_results

MODELS = ("tiny", "real-shape")
ENGINES = ("hf", "vllm")


def run(config: str | None, out_dir: Path, overrides: list[str], models: tuple[str, ...],
        engines: tuple[str, ...], prompts: int, samples: int, tokens: int, rounds: int) -> dict:
    from protocol.config import load_config

    cfg = load_config(config or "configs/tiny-cpu.yaml", overrides)
    paths = {m: _model_path(cfg, m) for m in models}
    results = {}
    for model in models:
        for engine in engines:
            pair = dict(model=model, path=str(paths[model]), engine=engine, prompts=prompts,
                        samples=samples, tokens=tokens, rounds=rounds,
                        dtype="float32" if model == "tiny" else "bfloat16",
                        threads=cfg.actors.threads, kv_cache_gib=cfg.actors.kv_cache_gib or 1.0,
                        enforce_eager=cfg.actors.enforce_eager, seed=cfg.run.seed)
            print(f"bench generation: {model} on {engine}", flush=True)
            results[f"{model}/{engine}"] = _run_pair(pair)
    summary = {"models": list(models), "engines": list(engines), "prompts": prompts,
               "samples": samples, "max_new_tokens": tokens, "rounds": rounds,
               "threads": cfg.actors.threads, "pairs": results,
               "vllm_over_hf": {m: _ratio(results, m) for m in models}, "machine": machine()}
    path = write_results(out_dir, summary)
    print(table(summary), end="")
    print(f"bench generation: results in {path}")
    return summary


def _model_path(cfg, model: str) -> Path:
    match model:
        case "tiny":
            if cfg.model.path:
                return Path(cfg.model.path)
            from rlvr.warm_start import ensure_warm_start
            return ensure_warm_start(cfg, lambda line: print(line, flush=True))
        case "real-shape":
            from rlvr.real_shape import ensure_real_shape
            return ensure_real_shape(Path(cfg.warm_start.cache_dir))
        case other:
            raise BenchError(f"unknown model {other!r}; choose from {list(MODELS)}")


def _run_pair(pair: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "rlvr.bench.generation", json.dumps(pair)],
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise BenchError(f"{pair['model']} on {pair['engine']} failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def _ratio(results: dict, model: str) -> dict | None:
    hf, vllm = results.get(f"{model}/hf"), results.get(f"{model}/vllm")
    if not hf or not vllm:
        return None
    return {"tokens_per_s": vllm["tokens_per_s"] / hf["tokens_per_s"],
            "update_s": vllm["update_s"] / max(hf["update_s"], 1e-9)}


def table(summary: dict) -> str:
    rows = [[name, r["params_m"], r["load_s"], r["tokens_per_s"], r["tokens_per_round"],
             r["update_s"] * 1000, r["update_mb"]] for name, r in summary["pairs"].items()]
    head = (f"{summary['prompts']} prompts x {summary['samples']} samples x <= "
            f"{summary['max_new_tokens']} tokens, {summary['threads']} thread(s), median of "
            f"{summary['rounds']} rounds\n\n")
    return head + markdown_table(["model/engine", "params (M)", "load s", "gen tokens/s",
                                  "tokens/round", "update ms", "update MB"], rows)


# -- the child: one engine on one model ---------------------------------------------------------

def measure(pair: dict) -> dict:
    import torch
    from tasks.tiny_model import load_tokenizer

    from actors.engines.factory import make_engine
    from tasks.arithmetic import Arithmetic
    from tasks.prompts import prompt_token_ids

    torch.set_num_threads(pair["threads"])
    t0 = time.perf_counter()
    if pair["engine"] == "hf":
        engine = make_engine("hf", pair["path"], device="cpu", dtype=pair["dtype"])
    else:
        engine = make_engine("vllm", pair["path"], device="cpu", dtype=pair["dtype"],
                             kv_cache_gib=pair["kv_cache_gib"], seed=pair["seed"],
                             enforce_eager=pair["enforce_eager"])
    load_s = time.perf_counter() - t0
    tok = load_tokenizer(pair["path"])
    problems = Arithmetic(levels=(2,), ops=("+",), eval_per_level=pair["prompts"]).eval_set()
    prompts = [prompt_token_ids(tok, p.question) for p in problems[:pair["prompts"]]]
    n = [pair["samples"]] * len(prompts)
    engine.generate(prompts, n, pair["tokens"])  # warm-up: first-call costs, full size
    rates, counts = [], []
    for _ in range(pair["rounds"]):
        t = time.perf_counter()
        out = engine.generate(prompts, n, pair["tokens"])
        dt = time.perf_counter() - t
        counts.append(sum(len(c.token_ids) for cs in out for c in cs))
        rates.append(counts[-1] / dt)
    targets = engine.weight_targets()
    new = [t.detach().clone().mul_(1.001) for _, t in targets]  # "the learner's next weights"
    updates = []
    for _ in range(pair["rounds"]):
        t = time.perf_counter()
        with torch.no_grad():
            for (_, dst), src in zip(targets, new):
                dst.copy_(src)
        engine.commit_weights()
        updates.append(time.perf_counter() - t)
    engine.close()
    return {"load_s": load_s, "tokens_per_s": statistics.median(rates),
            "tokens_per_round": statistics.median(counts),
            "update_s": statistics.median(updates),
            "update_mb": sum(t.numel() * t.element_size() for _, t in targets) / 1e6,
            "params_m": sum(t.numel() for _, t in targets) / 1e6}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))), flush=True)


# ---- the command line: `rlvr bench generation` (rlvr/bench/cli.py lists this module) ----

HELP = "HF vs vLLM generation tokens/s and weight update time"
NEEDS_CONFIG = False


def add_arguments(p) -> None:
    p.add_argument("--models", default="tiny,real-shape", help="comma-separated: tiny, real-shape")
    p.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    p.add_argument("--prompts", type=int, default=32, help="prompts per generate call")
    p.add_argument("--samples", type=int, default=8, help="responses per prompt")
    p.add_argument("--tokens", type=int, default=32, help="max new tokens per response")
    p.add_argument("--rounds", type=int, default=3, help="timed calls (after one warm-up)")


def check(args) -> str | None:
    for flag, given, known in [("--models", args.models, MODELS),
                               ("--engines", args.engines, ENGINES)]:
        unknown = [n for n in names(given) if n not in known]
        if unknown or not names(given):
            return f"{flag}: unknown {unknown}; choose from {list(known)}"
    low = [f"--{f} must be >= 1" for f in ("prompts", "samples", "tokens", "rounds")
           if getattr(args, f) < 1]
    return low[0] if low else None


def main(args, out: Path, overrides: list[str]) -> None:
    run(args.config, out, with_steps(overrides, args.steps), names(args.models),
        names(args.engines), args.prompts, args.samples, args.tokens, args.rounds)
