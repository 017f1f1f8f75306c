"""How much an actor and a learner slow each other down when they share this machine.

    python -m rlvr.plan.contention runs/bench/plan/runs/sync [--seconds 4]

A cluster gives actors and learner devices of their own; on the 2-core development machine they
share cores, memory bandwidth and caches, so when both compute at once each is slower than a
sync run (where they take turns) measured it. This probe measures that slowdown with the run's
own workloads in two real processes: an actor process generating a work item's responses with
the HF engine (rollout.prompts_per_work prompts x rollout.group_size, max_new_tokens), and a
learner process doing forward + backward + optimizer step on a batch of the same shape, each
with its configured threads. Each runs alone for `seconds`, then both together; the slowdown of
a role is its rate alone / its rate together. The simulator's `Machine(shared_cores, ...)` takes
them (rlvr/plan/sim.py). Whatever else runs on the machine at that moment is in the numbers.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path


def _worker(role: str, model_path: str, cfg_dict: dict, start, stop, out) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from protocol.config import Config, build

    cfg = build(Config, cfg_dict, [])
    threads = cfg.learner.threads if role == "learner" else cfg.actors.threads
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    r = cfg.rollout
    prompts = [[1 + (i * 7 + j) % 50 for j in range(8)] for i in range(r.prompts_per_work)]
    if role == "actor":
        from tasks.hf_engine import HFEngine

        sampler = HFEngine(model, cfg.actors.max_batch)

        def once():
            sampler.generate(prompts, [r.group_size] * len(prompts), r.max_new_tokens,
                             r.temperature)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        rows = r.prompts_per_step * 2
        ids = torch.randint(1, 50, (rows, 8 + r.max_new_tokens))

        def once():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    once()  # warm-up
    out.put(("ready", role))
    while True:
        phase = start.get()
        if phase is None:
            return
        n, t0 = 0, time.perf_counter()
        while not stop.is_set():
            once()
            n += 1
        out.put((phase, role, n / (time.perf_counter() - t0)))


def measure_slowdown(run_dir: str | Path, seconds: float = 4.0) -> dict:
    """{"actor_slowdown", "learner_slowdown", "rates"}: rates in work units per second."""
    from protocol.config import load_config, to_dict

    cfg = load_config(Path(run_dir) / "config.yaml", run_folder=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs, starts, stops = {}, {}, {}
    for role in ("actor", "learner"):
        starts[role], stops[role] = ctx.Queue(), ctx.Event()
        procs[role] = ctx.Process(target=_worker, daemon=True, args=(
            role, cfg.model.path, to_dict(cfg), starts[role], stops[role], out))
        procs[role].start()
    try:
        for _ in procs:
            out.get(timeout=300)
        rates: dict[str, dict[str, float]] = {}
        for phase, roles in (("alone", ["actor"]), ("alone", ["learner"]),
                             ("together", ["actor", "learner"])):
            for role in roles:
                stops[role].clear()
                starts[role].put(phase)
            time.sleep(seconds)
            for role in roles:
                stops[role].set()
            for _ in roles:
                got_phase, role, rate = out.get(timeout=300)
                rates.setdefault(role, {})[got_phase] = rate
        for role in procs:
            starts[role].put(None)
    finally:
        for p in procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return {"actor_slowdown": rates["actor"]["alone"] / rates["actor"]["together"],
            "learner_slowdown": rates["learner"]["alone"] / rates["learner"]["together"],
            "rates": rates, "seconds": seconds}


if __name__ == "__main__":
    import json

    secs = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 4.0
    print(json.dumps(measure_slowdown(sys.argv[1], secs), indent=2))
