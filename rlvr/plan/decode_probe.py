"""What a decode step of the run's engine costs, by rows in flight and the context they attend
over: the actor model's batching.

    python -m rlvr.plan.decode_probe runs/bench/plan/runs/sync

An actor decodes every request it holds in the same engine steps (continuous batching, actors/
rollouts.py), so a sample is cheaper when many are in flight: on the tiny model a step costs about
the same for 10 rows as for 100. A step also costs more the longer the rows' contexts are (every
row attends over the keys and values of its prompt and its answer so far): an engine kept full
by a stream of requests holds rows at every point of their answers, and pays more per row than
the same rows started together (scripts/hf_engine_rows.py measures both). A run's logs give each
sample's share of the steps it took part in, not how a step's cost splits; this probe measures
that split with the run's own engine, model and prompts on this machine: R requests of the run's
held-out prompts started at once, prefilled (until every row has its first token: vLLM prefills
a budget of tokens a step) and decoded to `rollout.max_new_tokens`, for R from 1 up to the
engine's batch; and the same prompts lengthened by part of an answer (what `recompute` prefills
again), prefilled and decoded a few steps. Least squares with no negative cost, over the steps:

    decode step = step_s + row_s x rows + col_s x rows x (prompt + tokens decoded)
    prefill     = prefill_s + rows x (prefill_row_s + prefill_col_s x W + prefill_sq_s x W^2)
                  + prefill_tokens_sq_s x (rows x W)^2

with W the prefill's width: the HF engine pads its rows to the longest (a fresh one's longest
prompt, `prompt_width`; under `recompute` prompt + partial answer), vLLM packs them (W their
mean). W^2 is attention within the prefill: on the long-tail task a row of 300 columns costs 9x
one of 52, not 6x. (rows x W)^2 is a pass outgrowing the caches, each token dearer the more the
pass holds: 512 rows cost 2.3-3.5x what 256 rows of the same width do there.

The prefill is fitted on relative error (`fit_prefill`): its points span four decades (a row of
a prompt, 2 ms; 512 rows of 300 columns, 16 s), and least squares on seconds fits the widest
few and misses the middle by 30-60%, where a run's re-prefills of 150-250 rows lie
(tests/data/longtail_prefills.json, tests/test_plan.py).

The simulator's `DecodeCost` takes them (rlvr/plan/sim_engine.py); `rlvr plan` adds the actor
loop's own time per step (messages, the verifier), calibrated on the measured run. Whatever else
runs on the machine at that moment is in the numbers.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

import numpy as np

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PROBE_KEYS = ("step_s", "row_s", "col_s", "prefill_s", "prefill_row_s", "prefill_col_s",
              "prefill_sq_s", "prefill_tokens_sq_s", "prompt_tokens", "prompt_width")
PREFILL_KEYS = ("prefill_s", "prefill_row_s", "prefill_col_s", "prefill_sq_s",
                "prefill_tokens_sq_s")


def fit_nonnegative(x: list[list[float]], y: list[float]) -> list[float]:
    """Least squares of y on the columns of x with every coefficient >= 0: the best fit among
    the subsets of columns whose own fit has no negative coefficient (a cost no measurement
    shows growing is taken as flat, not as negative)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    # each column at unit norm: the prefill's span 1 to (rows x width)^2 ~ 1e10
    norm = np.linalg.norm(a, axis=0)
    norm[norm == 0] = 1.0
    a = a / norm
    best, best_err = [0.0] * a.shape[1], float(np.sum(b * b))
    for mask in range(1, 1 << a.shape[1]):
        cols = [j for j in range(a.shape[1]) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if np.any(coef < 0):
            continue
        err = float(np.sum((a[:, cols] @ coef - b) ** 2))
        if err < best_err:
            best, best_err = [0.0] * a.shape[1], err
            for j, c in zip(cols, coef):
                best[j] = float(c / norm[j])
    return best


def prefill_terms(rows: float, width: float) -> list[float]:
    """What each of PREFILL_KEYS is paid per: a prefill, its rows, row-columns, row-columns
    squared, and its tokens squared."""
    return [1.0, rows, rows * width, rows * width * width, (rows * width) ** 2]


def fit_prefill(points: list[tuple[float, float, float]]) -> dict[str, float]:
    """PREFILL_KEYS from (rows, width, seconds) points, on relative error: each point's
    equation divided by its seconds, so a 2 ms prefill counts as much as a 16 s one."""
    timed = [(n, w, t) for n, w, t in points if t > 0]
    if not timed:
        raise ValueError("no prefill timed above 0 s: nothing to fit")
    coef = fit_nonnegative([[v / t for v in prefill_terms(n, w)] for n, w, t in timed],
                           [1.0] * len(timed))
    return dict(zip(PREFILL_KEYS, coef))


def measure_decode_cost(run_dir: str | Path, repeats: int = 2) -> dict:
    """{"step_s", "row_s", "col_s", PREFILL_KEYS, "prompt_tokens", "prompt_width", "max_batch",
    "engine", "kv_slots", "decode_points", "prefill_points", "prefill_steps"} for the run's
    engine (seconds; points as [rows, columns, seconds]: the columns a decode step attends over,
    rows x context; a prefill's width; the engine steps each prefill took)."""
    cfg, engine, prompts = _open_engine(run_dir)
    r = cfg.rollout
    top = cfg.actors.max_batch
    sizes = [n for n in ROWS if n < top] + [min(top, ROWS[-1])]
    # prompts lengthened by a quarter of an answer and by nearly a whole one, then a few decode
    # steps: a re-prefill's widths, and rows far into their answers from the first step (rows
    # started together reach long contexts only once most have ended: the context's cost per
    # row would be fitted on a few rows alone)
    tail = min(8, r.max_new_tokens)
    extra = sorted({max(1, r.max_new_tokens // 4), max(1, r.max_new_tokens - tail)})
    decode, prefill, prefill_steps, rid = [], [], [], 0
    hf = cfg.actors.engine == "hf"  # rows padded to the longest, in KV slots; vLLM packs them

    def batch(rows: int, lengthen: int, new_tokens: int) -> tuple[float, float, int, list]:
        nonlocal rid
        rid += rows
        return _timed_batch(engine, prompts, rid - rows, rows, lengthen, new_tokens,
                            r.temperature, hf)

    try:
        batch(1, 0, r.max_new_tokens)  # warms the engine up, not kept
        for rows in sizes:
            for _ in range(repeats):
                for lengthen, new_tokens in [(0, r.max_new_tokens)] + [(e, tail) for e in extra]:
                    padded, started, took_steps, steps = batch(rows, lengthen, new_tokens)
                    prefill.append((rows, padded, started))
                    prefill_steps.append(took_steps)
                    decode += steps
        # prompt tokens vLLM took from its prefix cache (rows of one batch sharing a prompt
        # or its template's first blocks): prefills timed cheaper than from nothing
        cached = getattr(engine, "prompt_tokens_cached", 0)
    finally:
        engine.close()
    return _fitted(run_dir, cfg, prompts, decode, prefill, prefill_steps, cached)


def _open_engine(run_dir: str | Path) -> tuple:
    """The run's config, its actor's engine and its held-out prompts' token ids."""
    import torch
    from tasks.tiny_model import load_tokenizer

    from actors.engines.factory import make_engine
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
    return cfg, engine, prompts


def _fitted(run_dir, cfg, prompts: list[list[int]], decode: list, prefill: list,
            prefill_steps: list[int], prompt_tokens_cached: int) -> dict:
    """The costs fitted on the timed decode steps and prefills, and the points themselves."""
    step_s, row_s, col_s = fit_nonnegative([[1.0, n, c] for n, c, _ in decode],
                                           [t for *_, t in decode])
    out = {"step_s": step_s, "row_s": row_s, "col_s": col_s, **fit_prefill(prefill),
           "prompt_tokens": float(np.mean([len(p) for p in prompts])),
           "prompt_width": float(max(len(p) for p in prompts)),
           "max_batch": cfg.actors.max_batch, "engine": cfg.actors.engine,
           "kv_slots": cfg.actors.engine == "hf", "prompt_tokens_cached": prompt_tokens_cached}
    if not all(math.isfinite(out[k]) for k in PROBE_KEYS):
        raise ValueError(f"{run_dir}: decode probe gave no finite fit")
    return out | {"decode_points": [[n, round(c, 1), round(t, 6)] for n, c, t in decode],
                  "prefill_points": [[n, round(w, 1), round(t, 6)] for n, w, t in prefill],
                  "prefill_steps": prefill_steps}


def _timed_batch(engine, prompts: list[list[int]], first_id: int, rows: int, lengthen: int,
                 new_tokens: int, temperature: float, hf: bool) -> tuple[float, float, int, list]:
    """`rows` requests (ids from `first_id`) run to their end on `engine`: (the width the prefill
    computed per row, its seconds, its engine steps, [(rows, columns, seconds)] per decode
    step)."""
    chosen = [prompts[(first_id + i) % len(prompts)] for i in range(rows)]
    # each row a partial answer of its own, as in a run: rows sharing a prompt share no KV
    # block past it (vLLM would read the later rows' from its prefix cache)
    chosen = [p + random.Random(first_id + i).choices(p, k=lengthen)
              for i, p in enumerate(chosen)]
    # vLLM keeps the prompt blocks of earlier batches: the same prompts would be prefilled from
    # its cache (the HF engine has none)
    getattr(engine, "drop_prefix_cache", lambda: None)()
    for i, p in enumerate(chosen):
        engine.add(first_id + i, p, new_tokens, temperature, 1.0)
    width = sum(map(len, chosen)) / rows  # mean context of a row
    padded = max(map(len, chosen)) if hf else width  # what the prefill computed per row
    # the prefill lasts until every row has its first token: vLLM prefills a budget of
    # tokens a step (max_num_batched_tokens, chunked), the HF engine all rows in one
    t0, ended, prefill_steps = time.perf_counter(), 0, 0
    while len(engine.running()) + ended < rows and engine.unfinished():
        ended += len(engine.step())
        prefill_steps += 1
    started = time.perf_counter() - t0
    steps, k = [], 0
    while engine.running():
        n, k = len(engine.running()), k + 1
        t0 = time.perf_counter()
        engine.step()
        took = time.perf_counter() - t0
        # what the step computed, where the engine says (the HF engine's free slots are
        # computed too, as it keeps them): else every row over its prompt and k tokens
        shape = getattr(engine, "last_decode_shape", None)
        steps.append((*(shape or (n, n * (width + k))), took))
    return padded, started, prefill_steps, steps


if __name__ == "__main__":
    import json

    out = measure_decode_cost(sys.argv[1])
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_points")}, indent=2))
