"""The learner's side of one real actor process, played by a test.

`FakeLearner` hosts the weight store and the ZeroMQ ROUTER exactly as the learner does, writes
the run config, starts `python -m actors.main` as `rlvr train` would, and then lets the test
hand out work, broadcast weights (as rank 0 of a real gloo weight group) and collect groups, at
the moments the test chooses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from protocol.config import load_config, write_resolved
from protocol.messages import (PROTOCOL_VERSION, Group, Hello, Prompt, RolloutSpec, Shutdown,
                               SyncWeights, Work)
from protocol.transport import LearnerEndpoint
from protocol.weights import WeightGroup, announce_sync, host_store
from rlvr.launch import free_port

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
V = PROTOCOL_VERSION


class FakeLearner:
    def __init__(self, run_dir: Path, model_path: Path, *overrides: str):
        self.run_dir = run_dir
        self.weights_port = free_port()
        self.store = host_store(HOST, self.weights_port, 60.0)
        self.endpoint = LearnerEndpoint(HOST, 0)
        cfg = load_config(ROOT / "configs" / "tiny-cpu.yaml",
                          [f"model.path={model_path}", f"net.zmq_port={self.endpoint.port}",
                           f"net.weights_port={self.weights_port}", "actors.heartbeat_s=0.5",
                           *overrides])
        write_resolved(cfg, run_dir)
        self.log = run_dir / "actor.log"
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "actors.main", "--run-dir", str(run_dir), "--actor-id",
                 "0"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.peer = self._expect(Hello, 120.0)[0]
        self.group: WeightGroup | None = None
        self.epoch = 1
        self._works = 0

    def _expect(self, kind, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"actor exited ({self.proc.returncode}):\n{self.tail()}")
            got = self.endpoint.recv(0.1)
            if got is not None and isinstance(got[1], kind):
                return got
        raise AssertionError(f"no {kind.__name__} within {timeout_s} s:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def announce(self, version: int, goes_ahead: bool = True) -> None:
        """Tell the actor to join the broadcast of `version` (the first time: form the group),
        then give the word that the sync goes ahead (or is called off)."""
        self.endpoint.send(self.peer, SyncWeights(protocol_version=V, policy_version=version,
                                                  group_epoch=self.epoch, rank=1, world_size=2))
        announce_sync(self.store, self.epoch, version, goes_ahead)

    def new_epoch(self) -> None:
        """Close the weight group (a sync failed or was called off): the next sync forms anew."""
        if self.group is not None:
            self.group.close()
        self.group, self.epoch = None, self.epoch + 1

    def count(self, kind, during_s: float) -> int:
        """Messages of `kind` received over the next `during_s` seconds (others are dropped)."""
        deadline, n = time.monotonic() + during_s, 0
        while (left := deadline - time.monotonic()) > 0:
            got = self.endpoint.recv(min(0.1, left))
            n += got is not None and isinstance(got[1], kind)
        return n

    def wait_for_log(self, text: str, timeout_s: float) -> float:
        """Seconds until `text` is in the actor's log; fails with the log after `timeout_s`."""
        t0 = time.monotonic()
        while text not in self.log.read_text():
            if time.monotonic() - t0 > timeout_s:
                raise AssertionError(f"no {text!r} in the actor's log within {timeout_s} s:\n"
                                     f"{self.tail()}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def broadcast(self, model) -> None:
        if self.group is None:
            self.group = WeightGroup.create(HOST, self.weights_port, 0, 2, 60.0,
                                            epoch=self.epoch, store=self.store)
        self.group.send(model.named_parameters())

    def sync(self, model, version: int) -> float:
        """A whole weight sync as the learner does it; returns the seconds the learner waited."""
        t0 = time.monotonic()
        self.announce(version)
        self.broadcast(model)
        return time.monotonic() - t0

    def work(self, prompts: list[Prompt], spec: RolloutSpec) -> str:
        self._works += 1
        work_id = f"w{self._works}"
        self.endpoint.send(self.peer, Work(protocol_version=V, policy_version=0, work_id=work_id,
                                           prompts=prompts, rollout=spec))
        return work_id

    def groups(self, count: int, timeout_s: float = 120.0) -> list[Group]:
        return [self._expect(Group, timeout_s)[1] for _ in range(count)]

    def close(self) -> None:
        try:
            self.endpoint.send(self.peer, Shutdown(protocol_version=V, policy_version=0))
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a test that failed midway still cleans up
            self.proc.kill()
            self.proc.wait()
        if self.group is not None:
            self.group.close()
        self.endpoint.close()


def prompt(i: int, token_ids: list[int], answer: str = "0", n: int = 8) -> Prompt:
    return Prompt(group_id=f"g{i}", prompt_id=f"p{i}", prompt_token_ids=token_ids,
                  answer=answer, n=n)
