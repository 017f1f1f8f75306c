"""Weight-sync channel: the learner (rank 0) broadcasts its parameters to the actors (1..A).

A dedicated process group beside DeepSpeed's default one: a `TCPStore` hosted by rank 0 and a
`ProcessGroupGloo` (NCCL on GPU) on a `PrefixStore` over it. Not `init_process_group`, which the
learner's DeepSpeed engine already owns.

    group = WeightGroup.create("127.0.0.1", port, rank, world_size, timeout_s=60.0)
    group.send(model.named_parameters())      # rank 0
    group.receive(model.named_parameters())   # ranks 1..A, same model architecture
    group.close()

One sync, every rank in the same order:
  1. header broadcast from rank 0: int64 [n_tensors, total_numel, crc32 of (name, dtype, shape)
     list, bucket_bytes];
  2. verdict all-gather: each rank says whether the header matches its own model, so a mismatch
     makes *every* rank raise `WeightSyncError` naming the ranks, instead of broadcasting garbage
     or leaving rank 0 to time out;
  3. buckets: tensors grouped by dtype (first-appearance order), in named_parameters order within
     a dtype, packed into flat buffers of at most `bucket_bytes` (a bigger tensor goes alone);
     each bucket is broadcast and copied into the receiver's parameters in place.
Flat buckets because one big broadcast beats many small ones (reference/CPU-STACK.md).

Every failure (peers that never arrive, a peer that dies, a peer that stops taking part) raises
`WeightSyncError` within about `timeout_s`: gloo's own timeout bounds each collective. After an
error the group is unusable: close it and create a new one. Close before exit (an undestroyed
gloo group can abort the process at interpreter shutdown).

Membership changes (an actor died, a restarted one joined) form a new group with a new `epoch`
over the same store: rank 0 hosts the store once for the run (`host_store`) and passes it to
every `create`; each epoch's group lives under its own key prefix, so the ranks of a new epoch
never meet the leftovers of a failed one.

    store = host_store("0.0.0.0", port, timeout_s=60.0)                   # learner, once
    group = WeightGroup.create(host, port, 0, 3, 60.0, epoch=4, store=store)
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import re
import socket
import time
import zlib
from collections.abc import Callable, Iterable
from typing import ContextManager

import torch
from torch.distributed import PrefixStore, TCPStore

from protocol.transport import PORT_REASONS, CannotListen

BUCKET_BYTES = 64 * 1024 * 1024


class WeightSyncError(RuntimeError):
    """The weight broadcast failed: timeout, dead peer, or a model that does not match."""


class WeightGroup:
    """One broadcast group: rank 0 sends, every other rank receives. Build with `create`."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, store, pg, device):
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._store = store  # rank 0 hosts it: keep it alive as long as the group
        self._pg = pg  # ProcessGroupGloo | ProcessGroupNCCL
        self._device = device

    @classmethod
    def create(
        cls,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        backend: str = "gloo",
        epoch: int = 0,
        store: TCPStore | None = None,
    ) -> WeightGroup:
        """Join the group of `epoch`; rank 0 hosts the store on host:port (pass the run's
        `host_store` as `store` to keep one across epochs). Raises `WeightSyncError` if the other
        ranks have not all arrived within about `timeout_s` seconds."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        what = f"weight group {host}:{port} epoch {epoch} rank {rank}/{world_size}"
        try:
            if store is None:
                store = host_store(host, port, timeout_s) if rank == 0 else \
                    connect_store(host, port, timeout_s)
            prefixed = PrefixStore(f"weights/{epoch}", store)
            pg = _make_process_group(backend, prefixed, rank, world_size, timeout)
        except (WeightSyncError, CannotListen):
            raise
        except Exception as e:  # noqa: BLE001 - c10d raises several RuntimeError subclasses
            raise WeightSyncError(
                f"{what}: setup failed (peers must all arrive within timeout {timeout_s} s): {e}"
            ) from e
        if backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        return cls(rank, world_size, timeout_s, store, pg, device)

    def send(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        bucket_bytes: int = BUCKET_BYTES,
        gather: Callable[[list[torch.Tensor]], ContextManager] | None = None,
    ) -> tuple[int, int]:
        """Rank 0: broadcast these tensors (e.g. `model.named_parameters()`) to every actor;
        returns the buckets and the bytes it broadcast.

        `gather` is for parameters sharded by ZeRO-3: `gather(params)` is a context manager under
        which those parameters hold their full data (DeepSpeed's `GatheredParameters`), entered
        once per bucket so at most one bucket is gathered at a time; the layout then comes from
        each parameter's full shape `ds_shape`."""
        assert self.rank == 0, "only rank 0 sends"
        named = [(n, t if gather else t.detach()) for n, t in named_tensors]
        layout = [(n, _full_shape_proxy(t)) for n, t in named] if gather else named
        self._check_header(_header(layout, bucket_bytes))
        by_name = dict(named)
        buckets = sent = 0
        for bucket in _buckets(layout, bucket_bytes):
            tensors = [by_name[n] for n, _ in bucket]
            with gather(tensors) if gather else contextlib.nullcontext():
                if len(tensors) == 1:  # one big tensor: no concatenation copy
                    flat = tensors[0].data.reshape(-1).contiguous()
                else:
                    flat = torch.cat([t.data.reshape(-1) for t in tensors])
                self._broadcast(flat.to(self._device), "bucket")
            buckets, sent = buckets + 1, sent + flat.numel() * flat.element_size()
        return buckets, sent

    @torch.no_grad()
    def receive(
        self, named_params: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        """Ranks 1..A: receive rank 0's tensors into these parameters, in place."""
        assert self.rank != 0, "rank 0 sends, it does not receive"
        named = list(named_params)
        self._check_header(_header(named, bucket_bytes))
        for bucket in _buckets(named, bucket_bytes):
            numels = [t.numel() for _, t in bucket]
            flat = torch.empty(sum(numels), dtype=bucket[0][1].dtype, device=self._device)
            self._broadcast(flat, "bucket")
            for (_, param), chunk in zip(bucket, flat.split(numels)):
                param.copy_(chunk.view_as(param))

    def close(self) -> None:
        """Destroy the group (and, on rank 0, the store). Idempotent."""
        if self._pg is not None:
            try:
                self._pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort: peers may already be gone
                pass
            self._pg = None
            self._store = None

    def __enter__(self) -> WeightGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- collectives, each bounded by the group's timeout --------------------------------------

    def _broadcast(self, tensor: torch.Tensor, what: str) -> None:
        self._run(lambda: self._pg.broadcast([tensor]).wait(), f"broadcast of {what}")

    def _check_header(self, mine: torch.Tensor) -> None:
        """Broadcast rank 0's header; every rank all-gathers whether it matches its own, and all
        ranks raise together if any does not, so no one is left waiting for buckets."""
        header = mine.clone() if self.rank == 0 else torch.zeros_like(mine)
        header = header.to(self._device)
        self._broadcast(header, "header")
        header = header.cpu()
        ok = int(torch.equal(header, mine))
        flag = torch.tensor([ok], dtype=torch.int64, device=self._device)
        flags = [torch.zeros_like(flag) for _ in range(self.world_size)]
        self._run(lambda: self._pg.allgather([flags], [flag]).wait(), "all-gather of verdicts")
        bad = [r for r, f in enumerate(flags) if int(f.item()) != 1]
        if bad:
            raise WeightSyncError(
                f"model mismatch on rank(s) {bad}: header [n_tensors, numel, layout_crc32, "
                f"bucket_bytes] from rank 0 is {header.tolist()}, rank {self.rank} has "
                f"{mine.tolist()}"
            )

    def _run(self, op, what: str) -> None:
        if self._pg is None:
            raise WeightSyncError("weight group is closed")
        try:
            op()
        except Exception as e:  # noqa: BLE001 - gloo raises plain RuntimeError for all of these
            raise WeightSyncError(
                f"{what} failed on rank {self.rank} (timeout {self.timeout_s} s; a peer timed "
                f"out, died or stopped taking part): {e}"
            ) from e


def host_store(host: str, port: int, timeout_s: float) -> TCPStore:
    """Rank 0's rendezvous store for the whole run: any number of ranks, of any epoch, may
    connect to it later (a restarted actor included). It listens on every address of this
    machine (c10d's server ignores `host`); a port taken or refused raises `CannotListen` naming
    net.weights_port."""
    try:
        return TCPStore(host, port, None, True, datetime.timedelta(seconds=timeout_s),
                        wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - c10d raises RuntimeError subclasses
        refusal = listen_refusal(e, port, "net.weights_port")
        if refusal is not None:
            raise refusal from None
        raise WeightSyncError(f"weight store on {host}:{port}: cannot listen: {e}") from e


def listen_refusal(error: Exception, port: int, port_key: str) -> CannotListen | None:
    """c10d's failure to listen on `port` as `CannotListen` naming `port_key`, when its message
    names a port's reason (torch's DistNetworkError: "code: -98, name: EADDRINUSE"); None for
    any other failure. c10d's servers listen on every address, so the message names the port."""
    found = re.search(r"name: (E[A-Z]+)", str(error))
    code = getattr(errno, found.group(1), None) if found else None
    if code not in PORT_REASONS:
        return None
    return CannotListen(f"cannot listen on port {port}: {os.strerror(code)}", code, port_key)


def connect_store(host: str, port: int, timeout_s: float) -> TCPStore:
    """A client of rank 0's store (an actor keeps one for the run)."""
    what = f"weight store {host}:{port}"
    _wait_for_listener(host, port, timeout_s, what)  # TCPStore's own retries run to ~2x timeout
    try:
        return TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - c10d raises RuntimeError subclasses
        raise WeightSyncError(f"{what}: cannot connect: {e}") from e


# Every sync is two-phase: the learner first tells each member to join (over ZeroMQ), then says
# in the store whether all of them were reached. Members wait for that word before they join a
# rendezvous or a broadcast, so a member found dead when told (the common case: a killed process's
# connection is closed) makes the learner call the sync off at once. Without the word the others
# would sit in a collective the learner never starts: a gloo operation cannot be cancelled, not
# by the peer closing its group nor by aborting one's own, and waits its full timeout.

def announce_sync(store: TCPStore, epoch: int, version: int, goes_ahead: bool) -> None:
    """The learner's word on the sync of `version` in weight group `epoch` (unique per sync:
    within an epoch each sync has a newer version, a failed one ends the epoch)."""
    store.set(f"sync/{epoch}/{version}", b"go" if goes_ahead else b"off")


def sync_goes_ahead(store: TCPStore, epoch: int, version: int) -> bool:
    """Wait (up to the store's timeout) for the learner's word on that sync."""
    try:
        return store.get(f"sync/{epoch}/{version}") == b"go"
    except Exception as e:  # noqa: BLE001 - a store timeout is a RuntimeError subclass
        raise WeightSyncError(f"no word from the learner on the sync of version {version} "
                              f"(weight group epoch {epoch}): {e}") from e


def _make_process_group(backend, store, rank, world_size, timeout):
    if backend == "gloo":
        return torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":  # GPU only, untested on CPU CI; NCCL timeouts abort via its watchdog
        opts = torch.distributed.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return torch.distributed.ProcessGroupNCCL(store, rank, world_size, opts)
    raise ValueError(backend)


def _wait_for_listener(host: str, port: int, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, timeout_s / 10)):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise WeightSyncError(
                    f"{what}: no store listening on rank 0 within timeout {timeout_s} s"
                ) from None
            time.sleep(0.05)


def _full_shape_proxy(param: torch.Tensor) -> torch.Tensor:
    """A data-less tensor with the parameter's full (unsharded) shape and dtype."""
    return torch.empty(tuple(getattr(param, "ds_shape", param.shape)), dtype=param.dtype,
                       device="meta")


def _header(named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> torch.Tensor:
    layout = "\n".join(f"{n}:{str(t.dtype)}:{tuple(t.shape)}" for n, t in named)
    numel = sum(t.numel() for _, t in named)
    crc = zlib.crc32(layout.encode())
    return torch.tensor([len(named), numel, crc, bucket_bytes], dtype=torch.int64)


def _buckets(named: list[tuple[str, torch.Tensor]], bucket_bytes: int):
    """Yield lists of (name, tensor): one dtype per bucket, at most `bucket_bytes` each unless a
    single tensor is bigger. Deterministic in (names, shapes, dtypes, bucket_bytes), so sender and
    receiver cut identical buckets."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for n, t in named:
        by_dtype.setdefault(t.dtype, []).append((n, t))
    for items in by_dtype.values():
        bucket, size = [], 0
        for n, t in items:
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((n, t))
            size += nbytes
        if bucket:
            yield bucket
