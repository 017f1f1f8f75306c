"""What the sandbox tests (tests/test_sandbox.py, tests/test_sandbox_limits.py) stand on: the
sandbox's processes machine-wide, a folder open to every user outside the jail, and a host
sentinel of the sandbox's own uid that only its namespaces and jail protect."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.sandbox import UIDS

ADD = [{"args": [1, 2], "expected": 3}, {"args": [5, 5], "expected": 10},
       {"args": [0, 0], "expected": 0}]


SENTINELS: set[int] = set()
"""Pids of the host sentinels (host_sentinel): of a sandbox's uid, but no sandbox's process."""


def sandbox_processes() -> list[str]:
    """Live processes of the sandbox's uids, machine-wide (a zombie has ended: it waits for the
    machine's init to reap it when its caller was killed), but for the host sentinels."""
    out = subprocess.run(["ps", "-e", "-o", "uid=,stat=,pid=,cmd="], capture_output=True,
                         text=True)
    return [line for line in out.stdout.splitlines()
            if UIDS[0] <= int(line.split()[0]) < UIDS[1] and not line.split()[1].startswith("Z")
            and int(line.split()[2]) not in SENTINELS]


@pytest.fixture
def open_dir():
    """A folder anyone may read and write, outside the sandbox: only the jail keeps a solution
    out of it (pytest's own tmp folders are closed to other users anyway). Not under /tmp, which
    the jail replaces with its own: a control can bind this one into the jail."""
    path = tempfile.mkdtemp(prefix="rlvr-open-", dir="/var/tmp")
    os.chmod(path, 0o777)
    yield Path(path)
    shutil.rmtree(path)


SENTINEL_UID = UIDS[0] + 4242


class HostSentinel:
    """A process and a file outside the sandbox that belong to the very uid the sandbox's
    solutions run as: no permission keeps a solution from signalling or writing them, only the
    sandbox's namespaces and jail do."""

    def __init__(self, folder: Path):
        self.process = subprocess.Popen(["sleep", "600"], user=SENTINEL_UID, group=SENTINEL_UID)
        SENTINELS.add(self.process.pid)
        self.file = folder / "sentinel"
        self.file.write_text("untouched\n")
        os.chown(self.file, SENTINEL_UID, SENTINEL_UID)
        self.expect_harm = False  # a control that opens the sandbox checks the harm itself

    def harm(self) -> list[str]:
        """What reached the sentinel: [] while it is as it was."""
        harm = []
        if self.process.poll() is not None:
            harm.append(f"process ended ({self.process.returncode})")
        elif Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
                in "tT":
            harm.append("process stopped")
        if self.file.read_text() != "untouched\n":
            harm.append("file written")
        return harm

    def remove(self) -> None:
        self.process.kill()
        self.process.wait()
        SENTINELS.discard(self.process.pid)


@pytest.fixture
def host_sentinel(open_dir, monkeypatch):
    """A host sentinel (HostSentinel), with the sandboxes of the test pinned to its uid; checked
    unharmed after the test."""
    fixed = SimpleNamespace(randrange=lambda *_: SENTINEL_UID)
    monkeypatch.setattr("tasks.sandbox.random", SimpleNamespace(SystemRandom=lambda: fixed))
    sentinel = HostSentinel(open_dir)
    yield sentinel
    harm = sentinel.harm()
    sentinel.remove()
    if not sentinel.expect_harm:
        assert harm == [], f"the escape reached the host: {harm}"


@pytest.fixture(autouse=True)
def nothing_left_running():
    # machine-wide: every test that runs a sandbox is in the sandbox lane (tests/lanes.py), which
    # one xdist worker runs whole, one test after another
    assert sandbox_processes() == []
    yield
    assert sandbox_processes() == []  # every process a solution started is gone with it


# passes only in a clean sandbox: /tmp empty, the harness's modules as they were
PROBE = ("import os\n"
         "def add(a, b):\n"
         "    return a + b if os.listdir('/tmp') == [] and len('ab') == 2 else None\n")
