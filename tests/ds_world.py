"""A DeepSpeed world of one rank (gloo) in a child process, for tests that build real engines.

Why a child: DeepSpeed keeps its world in module state, so in one test process a second world
(after another test module tore its own down) fails with "Group ... is not registered"; and the
world's MASTER_* / RANK variables, set in the test process, would reach every `rlvr` process a
later test starts there. A module-scoped `World` spawns one child that holds the world and runs
module-level test functions in it, one at a time:

    @pytest.fixture(scope="module")
    def world():
        with World() as w:
            yield w

    def _check(path):            # runs in the child; an assertion there fails the test
        engine = build_engine(...)
        assert ...

    def test_x(world, tmp_path):
        world.run(_check, str(tmp_path))
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import traceback

import pytest


def _serve(conn, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    import deepspeed
    import torch

    # one rank needs no shared-memory allreduce: skip building its C++ kernel
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    try:
        while (call := conn.recv()) is not None:
            module, name, args = call
            try:
                conn.send(("ok", getattr(importlib.import_module(module), name)(*args)))
            except BaseException:  # noqa: BLE001 - the test fails with the child's traceback
                conn.send(("error", traceback.format_exc()))
    finally:
        torch.distributed.destroy_process_group()


class World:
    def __init__(self, timeout_s: float = 300.0):
        from rlvr.launch import free_port

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, free_port()), daemon=True)
        self.proc.start()
        self.timeout_s = timeout_s

    def run(self, fn, *args):
        """`fn(*args)` in the child (a module-level function; args and result pickled)."""
        self.conn.send((fn.__module__, fn.__name__, args))
        if not self.conn.poll(self.timeout_s):
            pytest.fail(f"{fn.__name__} did not return within {self.timeout_s:.0f} s")
        try:
            kind, value = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            pytest.fail(f"the DeepSpeed world's process died in {fn.__name__} (exit code "
                        f"{self.proc.exitcode})", pytrace=False)
        if kind == "error":
            pytest.fail(f"{fn.__name__} failed in the DeepSpeed world:\n{value}", pytrace=False)
        return value

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()
