"""Every actor start draws its own random stream, recorded in the run folder (actors/seeds.py)."""

from __future__ import annotations

import json
import multiprocessing as mp

from actors.seeds import actor_seed, claim_start


def test_each_start_of_each_actor_claims_the_next_number_and_its_own_seed(tmp_path):
    claims = [claim_start(tmp_path, a, 7) for a in (0, 1, 0, 0, 1)]
    assert [start for start, _ in claims] == [0, 0, 1, 2, 1]
    seeds = [seed for _, seed in claims]
    assert len(set(seeds)) == 5  # no two actors, no two starts share a stream
    record = json.loads((tmp_path / "actors" / "actor0-start2.json").read_text())
    assert record["seed"] == seeds[3] == actor_seed(7, 0, 2)  # reproducible from the record
    assert actor_seed(8, 0, 2) != actor_seed(7, 0, 2)  # and from the run's seed


def _claim(run_dir, out):
    out.put(claim_start(run_dir, 3, 0)[0])


def test_processes_starting_together_never_claim_the_same_start(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(tmp_path, out)) for _ in range(4)]
    for p in procs:
        p.start()
    starts = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert starts == [0, 1, 2, 3]
