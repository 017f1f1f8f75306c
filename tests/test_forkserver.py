"""The fork server the suite's runs start their processes from (tests/forkserver.py): a child
is `python -m MODULE` in the request's world, and the launcher sees it as a Popen."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

from tests.conftest import rlvr_env
from tests.forkserver import SOCKET_ENV, spawn

PROBE = '''import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("PROBE_VAR"), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(600)
sys.exit(int(sys.argv[1]))
'''


@pytest.fixture
def world(tmp_path):
    (tmp_path / "forkprobe.py").write_text(PROBE)
    return {**rlvr_env(), "PYTHONPATH": str(tmp_path), "PROBE_VAR": "set"}


def test_a_child_runs_the_module_with_its_argv_environment_and_log_and_returns_its_code(
        tmp_path, world):
    log = tmp_path / "child.log"
    child = spawn(["forkprobe", "3"], log, world, (), None)
    assert child.wait(60) == 3 and child.poll() == 3
    assert log.read_text() == f"argv ['3'] cwd {os.getcwd()} var set\n"


def test_a_child_killed_by_a_signal_reports_it_as_popen_does(tmp_path, world):
    child = spawn(["forkprobe", "sleep"], tmp_path / "child.log", world, (), None)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.5)
    child.terminate()
    assert child.wait(30) == -signal.SIGTERM


def test_a_launcher_gone_before_its_request_leaves_the_server_serving(tmp_path, world):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as gone:
        gone.connect(world[SOCKET_ENV])
    child = spawn(["forkprobe", "0"], tmp_path / "child.log", world, (), None)
    assert child.wait(60) == 0
