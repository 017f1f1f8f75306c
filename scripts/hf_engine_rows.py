"""Tokens per second of the HF engine against the rows it holds, in the two ways a stream of
requests can use it:

  steady - `rows` requests running, a new one joining as soon as one finishes (what the
           `continue`, `recompute` and `abort` policies keep up between syncs)
  batch  - `rows` requests started together and run to the end (what `finish` does between
           two syncs: the engine drains, then refills)

    python scripts/hf_engine_rows.py configs/tiny-cpu-longtail.yaml 32 128 256

One torch thread, as an actor has by default; the prompts are the config's training prompts and
the model its cached warm start (built first if missing). Each line also gives the milliseconds
of a decode step per row while at least 80% of the rows run: in `batch` those are the first
decode steps (the prefill step left out), every row's context short, which is what
rlvr/plan/decode_probe.py fits its cost per row on; in `steady` every step, rows at every point
of their answers and new ones joining.
"""

from __future__ import annotations

import sys
import time

import torch
from tasks.tiny_model import load_tokenizer

from tasks.hf_engine import HFEngine
from learner.data import PromptStream
from protocol.config import load_config
from rlvr.warm_start import ensure_warm_start


def measure(engine: HFEngine, prompts: list[list[int]], rows: int, steady: bool,
            max_new_tokens: int, steps: int = 150, rounds: int = 5) -> tuple[float, float, float]:
    """(tokens/s, mean rows per decode step, ms per row of a step with >= 80% of `rows`
    running). `batch` runs `rounds` batches back to back: one lasts well under a second at 32
    rows, too short to time alone."""
    engine.max_batch = rows
    next_id, tokens, done_steps, t0 = 0, 0, 0, time.perf_counter()
    full_rows, full_s = 0, 0.0
    for _ in range(1 if steady else rounds):
        for _ in range(rows):
            engine.add(next_id, prompts[next_id % len(prompts)], max_new_tokens)
            next_id += 1
        prefill = not steady  # a batch's first step prefills every row: not a decode step
        while engine.unfinished() and (not steady or done_steps < steps):
            t_step = time.perf_counter()
            finished = engine.step()
            done_steps += 1
            tokens += engine.last_step_rows
            if engine.last_step_rows >= 0.8 * rows and not prefill:
                full_rows += engine.last_step_rows
                full_s += time.perf_counter() - t_step
            prefill = False
            for _ in finished if steady else ():
                engine.add(next_id, prompts[next_id % len(prompts)], max_new_tokens)
                next_id += 1
    seconds = time.perf_counter() - t0
    engine.abort(engine.running() + list(engine._waiting))
    return tokens / seconds, tokens / max(done_steps, 1), 1000 * full_s / max(full_rows, 1)


def main(config: str, rows: list[int]) -> None:
    torch.set_num_threads(1)
    cfg = load_config(config)
    path = ensure_warm_start(cfg)
    engine = HFEngine.load(str(path))
    stream = PromptStream(cfg, load_tokenizer(path))
    prompts = [next(stream).prompt_token_ids for _ in range(max(rows))]
    for n in rows:
        for steady in (True, False):
            rate, mean_rows, full_ms = measure(engine, prompts, n, steady,
                                               cfg.rollout.max_new_tokens)
            print(f"{'steady' if steady else 'batch':>6} {n:4d} rows: {rate:6.0f} tokens/s, "
                  f"{mean_rows:5.1f} rows per decode step, {full_ms:.3f} ms a row while >= 80% "
                  "run", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]] or [32, 128, 256])
