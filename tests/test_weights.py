"""The weight-sync channel (protocol/weights.py) between real processes over gloo on loopback:
rank 0 (this test process) broadcasts a small module to actor processes (spawned), a mismatched
model fails on every rank, and missing, stalled or dead peers raise WeightSyncError within the
timeout instead of hanging."""

import contextlib
import multiprocessing as mp
import os
import time

import pytest
import torch
from torch import nn

from protocol.weights import (WeightGroup, WeightSyncError, announce_sync, connect_store,
                              host_store, sync_goes_ahead)
from rlvr.launch import free_port
from tests.calibration import record

HOST = "127.0.0.1"
SMALL_BUCKET_BYTES = 256  # forces several buckets per dtype


def make_model(seed: int, hidden: int = 16) -> nn.Module:
    """Two dtypes, so buckets must be dtype-homogeneous."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 4))
    model[2].to(torch.bfloat16)
    return model


def actor_server(commands, results) -> None:
    """Child: the actor side of the channel, driven by commands, so one pair of spawned processes
    (each torch import costs seconds on 2 cores) serves every test in this file. One reply per
    command."""
    torch.set_num_threads(1)
    group, reply = None, "ready"
    while True:
        results.put(reply)
        cmd, *args = commands.get()
        try:
            if cmd == "join":
                group = WeightGroup.create(HOST, *args)
                reply = "joined"
            elif cmd == "receive":  # into a model initialised differently from rank 0's
                model = make_model(seed=group.rank, hidden=args[0])
                group.receive(model.named_parameters(), bucket_bytes=SMALL_BUCKET_BYTES)
                expected = make_model(seed=0, hidden=args[0])
                pairs = zip(model.parameters(), expected.parameters())
                reply = "equal" if all(torch.equal(a, b) for a, b in pairs) else "different"
            elif cmd == "close":
                group.close()
                reply = "closed"
            elif cmd == "die":
                os._exit(1)
            else:
                return
        except WeightSyncError as e:
            reply = f"WeightSyncError: {e}"


class ActorPool:
    """Spawned actor processes: started once per module, replaced when dead, always reaped."""

    def __init__(self, n: int):
        self.ctx = mp.get_context("spawn")
        self.procs, self.commands, self.results = [None] * n, [None] * n, [None] * n

    def ensure_alive(self) -> None:
        dead = [i for i, p in enumerate(self.procs) if p is None or not p.is_alive()]
        for i in dead:
            self.commands[i], self.results[i] = self.ctx.Queue(), self.ctx.Queue()
            self.procs[i] = self.ctx.Process(
                target=actor_server, args=(self.commands[i], self.results[i]), daemon=True
            )
            self.procs[i].start()
        assert [self.reply(i) for i in dead] == ["ready"] * len(dead)

    def tell(self, i: int, *cmd) -> None:
        self.commands[i].put(cmd)

    def reply(self, i: int, timeout_s: float = 60.0) -> str:
        return self.results[i].get(timeout=timeout_s)

    def kill(self) -> None:
        for p in self.procs:
            if p is not None and p.is_alive():
                p.kill()
            if p is not None:
                p.join()

    def reap(self) -> None:
        for i, p in enumerate(self.procs):
            if p is not None and p.is_alive():
                self.tell(i, "exit")
                p.join(timeout=5.0)
        self.kill()


@pytest.fixture(scope="module")
def pool():
    actors = ActorPool(2)
    yield actors
    actors.reap()


@contextlib.contextmanager
def weight_group(pool: ActorPool, n_actors: int, timeout_s: float = 20.0):
    """Rank 0 here, ranks 1..n_actors in the pool, on a fresh port. Any failure kills the pool
    (it is respawned for the next test) so no actor is left blocked in a half-done sync."""
    pool.ensure_alive()
    port, world_size = free_port(), n_actors + 1
    try:
        for i in range(n_actors):
            pool.tell(i, "join", port, i + 1, world_size, 20.0)
        with WeightGroup.create(HOST, port, 0, world_size, timeout_s) as group:
            assert [pool.reply(i) for i in range(n_actors)] == ["joined"] * n_actors
            yield group
        alive = [i for i in range(n_actors) if pool.procs[i].is_alive()]
        for i in alive:
            pool.tell(i, "close")
        assert [pool.reply(i) for i in alive] == ["closed"] * len(alive)
    except BaseException:
        pool.kill()
        raise


def test_rank_zero_broadcasts_a_module_to_two_actor_processes(pool):
    with weight_group(pool, n_actors=2) as group:
        pool.tell(0, "receive", 16)
        pool.tell(1, "receive", 16)
        group.send(make_model(seed=0).named_parameters(), bucket_bytes=SMALL_BUCKET_BYTES)
        assert [pool.reply(0), pool.reply(1)] == ["equal", "equal"]


def test_a_mismatched_model_fails_on_every_rank_and_leaves_the_group_usable(pool):
    with weight_group(pool, n_actors=2) as group:
        pool.tell(0, "receive", 16)
        pool.tell(1, "receive", 17)  # rank 2 has another architecture
        with pytest.raises(WeightSyncError, match=r"model mismatch on rank\(s\) \[2\]"):
            group.send(make_model(seed=0).named_parameters(), bucket_bytes=SMALL_BUCKET_BYTES)
        for i in (0, 1):
            assert "model mismatch on rank(s) [2]" in pool.reply(i)
        # every rank stopped at the same point, so the next sync works
        pool.tell(0, "receive", 16)
        pool.tell(1, "receive", 16)
        group.send(make_model(seed=0).named_parameters(), bucket_bytes=SMALL_BUCKET_BYTES)
        assert [pool.reply(0), pool.reply(1)] == ["equal", "equal"]


def test_an_actor_that_never_joins_makes_rank_zero_raise_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match="timeout 3.0 s"):
        WeightGroup.create(HOST, free_port(), rank=0, world_size=2, timeout_s=3.0)
    elapsed = time.monotonic() - start
    # calibrated: 3.02 +- 0.00939 over 5 runs (tests/README.md)
    record("rank 0 alone (timeout 3 s) raises after s", elapsed, high=6.0)
    assert elapsed < 3.0 + 3.0


def test_an_actor_without_a_learner_raises_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match="timeout 1.0 s"):
        WeightGroup.create(HOST, free_port(), rank=1, world_size=2, timeout_s=1.0)
    elapsed = time.monotonic() - start
    # calibrated: 1.02 +- 0.00394 over 5 runs (tests/README.md)
    record("an actor alone (timeout 1 s) raises after s", elapsed, high=3.0)
    assert elapsed < 1.0 + 2.0


def test_an_actor_that_joins_but_stalls_makes_the_send_raise_within_the_timeout(pool):
    with weight_group(pool, n_actors=1, timeout_s=3.0) as group:
        start = time.monotonic()  # the actor is never told to receive
        with pytest.raises(WeightSyncError, match="timeout 3.0 s"):
            group.send(make_model(seed=0).named_parameters())
        elapsed = time.monotonic() - start
        # calibrated: 3.01 +- 0.00223 over 5 runs (tests/README.md)
        record("a send to a stalled actor (timeout 3 s) raises after s", elapsed, high=5.0)
        assert elapsed < 3.0 + 2.0


def test_an_actor_that_dies_makes_the_send_raise_at_once(pool):
    with weight_group(pool, n_actors=1) as group:
        pool.tell(0, "die")
        pool.procs[0].join(timeout=20.0)
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match="timeout 20.0 s"):
            group.send(make_model(seed=0).named_parameters())
        elapsed = time.monotonic() - start
        # calibrated: 0.00338 +- 0.00139 over 5 runs (tests/README.md)
        record("a send to a dead actor (timeout 20 s) raises after s", elapsed, high=5.0)
        assert elapsed < 5.0


def test_a_closed_group_refuses_to_sync():
    group = WeightGroup(0, 1, 1.0, None, None, torch.device("cpu"))
    with pytest.raises(WeightSyncError, match="closed"):
        group.send(make_model(seed=0).named_parameters())


def test_after_an_actor_dies_the_next_epoch_over_the_same_store_serves_the_survivor(pool):
    pool.ensure_alive()
    port = free_port()
    store = host_store(HOST, port, 20.0)  # the learner's, for the whole run
    try:
        for i in (0, 1):
            pool.tell(i, "join", port, i + 1, 3, 20.0, "gloo", 1)
        group = WeightGroup.create(HOST, port, 0, 3, 20.0, epoch=1, store=store)
        assert [pool.reply(0), pool.reply(1)] == ["joined", "joined"]
        pool.tell(1, "die")
        pool.procs[1].join(timeout=20.0)
        pool.tell(0, "receive", 16)
        with pytest.raises(WeightSyncError):
            group.send(make_model(seed=0).named_parameters(), bucket_bytes=SMALL_BUCKET_BYTES)
        group.close()
        assert pool.reply(0).startswith("WeightSyncError")
        pool.tell(0, "close")
        assert pool.reply(0) == "closed"
        # epoch 2: the survivor alone, same port, same store
        pool.tell(0, "join", port, 1, 2, 20.0, "gloo", 2)
        with WeightGroup.create(HOST, port, 0, 2, 20.0, epoch=2, store=store) as group:
            assert pool.reply(0) == "joined"
            pool.tell(0, "receive", 16)
            group.send(make_model(seed=0).named_parameters(), bucket_bytes=SMALL_BUCKET_BYTES)
            assert pool.reply(0) == "equal"
        pool.tell(0, "close")
        assert pool.reply(0) == "closed"
    except BaseException:
        pool.kill()
        raise


def test_a_sync_called_off_by_the_learner_is_refused_by_the_members():
    port = free_port()
    store = host_store(HOST, port, 5.0)
    member = connect_store(HOST, port, 5.0)
    announce_sync(store, 3, 7, goes_ahead=False)
    announce_sync(store, 4, 7, goes_ahead=True)
    announce_sync(store, 4, 8, goes_ahead=False)
    assert not sync_goes_ahead(member, 3, 7)
    assert sync_goes_ahead(member, 4, 7)
    assert not sync_goes_ahead(member, 4, 8)


def test_a_taken_weights_port_is_refused_naming_the_key():
    import socket

    from protocol.transport import CannotListen

    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(CannotListen) as refused:
            host_store(HOST, port, 5.0)
    assert refused.value.in_use
    assert refused.value.advice() == (
        f"net.weights_port: cannot listen on port {port}: Address already in use (another "
        "process holds it: choose another port, or 0 for a free one)")
