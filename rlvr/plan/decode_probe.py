"""What a decode step of the run's engine costs, by rows in flight: the actor model's batching.

    python -m rlvr.plan.decode_probe runs/bench/plan/runs/sync

An actor decodes every request it holds in the same engine steps (continuous batching, actors/
stream.py), so a sample is cheaper when many are in flight: on the tiny model a step costs about
the same for 10 rows as for 100. A run's logs give each sample's share of the steps it took part
in, not how a step's cost splits between a fixed part and a part per row; this probe measures
that split with the run's own engine, model and prompts on this machine: R requests of the run's
held-out prompts started at once (the prefill), then decoded to `rollout.max_new_tokens`, for R
from 1 up to the engine's batch; least squares over the steps give

    decode step = step_s + row_s x rows running        prefill = prefill_s + prefill_row_s x rows

The simulator's `DecodeCost` takes them (rlvr/plan/stream_actor.py); `rlvr plan` adds the actor
loop's own time per step (messages, the verifier), calibrated on the measured run. Whatever else
runs on the machine at that moment is in the numbers.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of seconds against rows, both clamped at >= 0."""
    a = np.array([[1.0, float(n)] for n, _ in points])
    b = np.array([t for _, t in points])
    (c0, c1), *_ = np.linalg.lstsq(a, b, rcond=None)
    if c1 < 0:  # no growth with rows measurable: a flat cost
        return max(0.0, float(np.mean(b))), 0.0
    if c0 < 0:
        return 0.0, max(0.0, float(np.sum(a[:, 1] * b) / np.sum(a[:, 1] ** 2)))
    return float(c0), float(c1)


def measure_decode_cost(run_dir: str | Path, repeats: int = 2) -> dict:
    """{"step_s", "row_s", "prefill_s", "prefill_row_s", "max_batch", "decode_points",
    "prefill_points"} for the run's engine (seconds; points as [rows, seconds])."""
    import torch
    from tasks.tiny_model import load_tokenizer

    from actors.engines import make_engine
    from actors.worker import engine_kwargs
    from learner.data import held_out
    from protocol.config import load_config
    from tasks.prompts import prompt_token_ids

    cfg = load_config(Path(run_dir) / "config.yaml", run_folder=True)
    torch.set_num_threads(cfg.actors.threads)
    engine = make_engine(cfg.actors.engine, cfg.model.path, **engine_kwargs(cfg))
    tokenizer = load_tokenizer(cfg.model.path)
    prompts = [prompt_token_ids(tokenizer, p.question, cfg.task.prompt_template)
               for p in held_out(cfg)]
    if not prompts:
        raise ValueError(f"{run_dir}: the run's task has no held-out prompts to probe with")
    r = cfg.rollout
    top = cfg.actors.max_batch
    sizes = [n for n in ROWS if n < top] + [min(top, ROWS[-1])]
    decode, prefill, rid = [], [], 0
    try:
        for k, rows in enumerate([1] + sizes):  # round 0 warms the engine up, not kept
            for _ in range(repeats):
                for i in range(rows):
                    engine.add(rid, prompts[(rid + i) % len(prompts)], r.max_new_tokens,
                               r.temperature, 1.0)
                    rid += 1
                t0 = time.perf_counter()
                engine.step()
                started = time.perf_counter() - t0
                steps = []
                while engine.running():
                    n = len(engine.running())
                    t0 = time.perf_counter()
                    engine.step()
                    steps.append((n, time.perf_counter() - t0))
                if k > 0:
                    prefill.append((rows, started))
                    decode += steps
    finally:
        engine.close()
    step_s, row_s = fit_line(decode)
    prefill_s, prefill_row_s = fit_line(prefill)
    if not all(math.isfinite(x) for x in (step_s, row_s, prefill_s, prefill_row_s)):
        raise ValueError(f"{run_dir}: decode probe gave no finite fit")
    return {"step_s": step_s, "row_s": row_s, "prefill_s": prefill_s,
            "prefill_row_s": prefill_row_s, "max_batch": top, "engine": cfg.actors.engine,
            "decode_points": [[n, round(t, 6)] for n, t in decode],
            "prefill_points": [[n, round(t, 6)] for n, t in prefill]}


if __name__ == "__main__":
    import json

    out = measure_decode_cost(sys.argv[1])
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_points")}, indent=2))
