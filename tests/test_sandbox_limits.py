"""The code sandbox (tasks/sandbox.py) at its limits: wall time, memory, the network, a caller
interrupted or killed, forged replies, runs beside each other; and the code reward that runs
it in the verifier's child."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

import pytest

from rlvr.warm_start import corrupt_answer
from tasks import code, sandbox_jail
from tasks.code import unit_tests
from tasks.sandbox import Limits, Result, Sandbox, _send, run_tests
from tasks.verifier import Verifier
from tests.calibration import record
from tests.conftest import ROOT
# the fixtures too: pytest finds them by name in this module
from tests.sandbox_guard import (ADD, PROBE, host_sentinel, nothing_left_running, open_dir,
                                 sandbox_processes)  # noqa: F401


def test_a_solution_past_the_wall_limit_costs_its_sandbox_and_the_next_run_starts_one():
    with Sandbox(Limits(wall_s=2)) as sandbox:
        sleeper = "import time\ndef add(a, b):\n    time.sleep(600)\n"
        assert sandbox.run(sleeper, "add", ADD) == Result(0, 3, "timed out")
        assert sandbox_processes() == []  # killed whole
        assert sandbox.run(PROBE, "add", ADD) == Result(3, 3)
        assert sandbox.starts == 2


@pytest.mark.usefixtures("host_sentinel")
def test_no_shared_memory_or_message_queue_can_be_made_to_outlive_a_solution():
    # System V objects live as long as their IPC namespace, the sandbox's: outside any
    # solution's memory limit, and readable by the next one
    ipc = ("import ctypes\n"
           "def add(a, b):\n"
           "    libc = ctypes.CDLL(None)\n"
           "    made = [libc.shmget(0, 1 << 20, 0o1600), libc.msgget(0, 0o1600),\n"
           "            libc.semget(0, 1, 0o1600)]\n"
           "    return a + b if made == [-1, -1, -1] else None\n")
    assert run_tests(ipc, "add", ADD) == Result(3, 3)


# Scans the memory its process was forked with, a page at a time through a pipe (an unmapped page
# fails the write, harmlessly), for what the solution before it returned and for its source, and
# for a marker it made itself: it passes only if it found its marker (the scan works) and nothing
# of the earlier solution.
SCANNER = r"""
import ctypes, os, re
def add(a, b):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.malloc.restype = ctypes.c_void_p
    libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    r, w = os.pipe()
    marker = b"MARKER_%d_MADE" % (6 * 7 * 1000 + a)  # in its heap, not in its source
    wanted = re.compile(rb"EARLIE[R]_\d+_\d+|SOURCE_OF_EARLIE[R]")  # not itself
    mine = re.compile(rb"MARKE[R]_\d{5}_MADE")
    found = marked = 0
    for centre in (id(object()), id(re), libc.malloc(64),
                   ctypes.addressof(ctypes.create_string_buffer(100000))):
        base = (centre & ~0xFFF) - (64 << 20)
        for page in range(base, base + (128 << 20), 4096):
            if libc.write(w, page, 4096) == 4096:
                chunk = os.read(r, 4096)
                found += bool(wanted.search(chunk))
                marked += bool(mine.search(chunk))
    return a + b if found == 0 and marked and len(marker) else [found, marked]
"""
# longer than the scanner, so that the scanner's own source, read where it was, does not cover it
EARLIER = ("def add(a, b):\n"
           "    return 'EARLIER_%d_%d' % (a, b)\n" + "#" * 4000 + "\n# SOURCE_OF_EARLIER\n")


@pytest.mark.usefixtures("host_sentinel")
def test_a_solution_finds_nothing_of_an_earlier_one_in_the_memory_it_was_forked_with():
    with Sandbox(Limits(wall_s=20, cpu_s=15)) as sandbox:
        for _ in range(2):  # solutions before it, as in a run
            assert sandbox.run(PROBE, "add", ADD).passed == 3
        assert sandbox.run(EARLIER, "add", ADD).passed == 0
        assert sandbox.run(SCANNER, "add", ADD[:1]) == Result(1, 1)
        assert sandbox.starts == 1


class Interrupted(Exception):
    """The verifier's per-item timer, say, firing inside a run."""


def test_a_caller_interrupted_while_the_sandbox_cleans_up_leaves_nothing_to_the_next_run(
        monkeypatch):
    ask = Sandbox._ask

    def interrupted_at_the_end(self, obj, deadline, then=b"", end=False):
        if end:  # sent, then interrupted while waiting for "clean"
            _send(self._proc, obj, deadline)
            raise Interrupted
        return ask(self, obj, deadline, then, end)

    with Sandbox() as sandbox:
        monkeypatch.setattr(Sandbox, "_ask", interrupted_at_the_end)
        with pytest.raises(Interrupted):
            sandbox.run(PROBE, "add", ADD)
        monkeypatch.setattr(Sandbox, "_ask", ask)
        assert sandbox.run(PROBE, "add", ADD) == Result(3, 3)  # not the late "clean"


def test_a_sandbox_killed_between_two_runs_costs_the_next_one_nothing():
    with Sandbox() as sandbox:
        assert sandbox.run(PROBE, "add", ADD) == Result(3, 3)
        os.killpg(sandbox._proc.pid, 9)  # the machine's OOM killer, say
        sandbox._proc.wait()
        assert sandbox.run(PROBE, "add", ADD) == Result(3, 3)
        assert sandbox.starts == 2


def call_home(port: int) -> str:
    """Connects to the host's `port`; passes its test only if the connection failed."""
    return ("import socket\n"
            "def add(a, b):\n"
            "    try:\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "    except OSError:\n"
            "        return a + b\n"
            "    return 'connected'\n")


def connections_to_a_listener(solution) -> tuple[Result, int]:
    """Runs `solution(port)` against a listener on the host's loopback: its result and how many
    connections the listener took."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        result = run_tests(solution(server.getsockname()[1]), "add", ADD[:1])
        server.settimeout(0.5)
        accepted = 0
        while True:
            try:
                server.accept()[0].close()
            except socket.timeout:
                return result, accepted
            accepted += 1
    finally:
        server.close()


@pytest.mark.usefixtures("host_sentinel")
def test_the_network_is_out_of_reach():
    assert connections_to_a_listener(call_home) == (Result(1, 1), 0)


def test_control_without_its_network_namespace_the_solution_connects(monkeypatch):
    monkeypatch.setattr(sandbox_jail, "CLONE_NEWNET", 0)
    assert connections_to_a_listener(call_home) == (Result(0, 1), 1)


@pytest.mark.usefixtures("host_sentinel")
def test_memory_past_the_limit_fails_the_test_not_the_machine():
    hog = "def add(a, b):\n    return len(bytearray(4 * 1024 ** 3)) and a + b\n"
    assert run_tests(hog, "add", ADD[:1], Limits(memory_mb=256)).passed == 0
    assert run_tests("def add(a, b):\n    return a + b\n", "add", ADD[:1],
                     Limits(memory_mb=256)).passed == 1  # the limit leaves room for Python


TESTS = json.dumps({"function": "add", "tests": ADD})


def test_the_code_reward_scores_a_response_in_the_verifiers_child():
    right = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    half = "```python\ndef add(a, b):\n    return a * b if a == 0 else a + b + 1\n```"
    with Verifier(timeout_s=5.0, reward="tasks.code:unit_tests") as v:
        scores = v.judge([right, half, "def add(a, b): return a + b", "no code", right],
                         [TESTS] * 4 + ["not json"])
    assert [(s.reward, s.acc) for s in scores[:4]] == [(1.0, True), (1 / 3, False),
                                                       (1.0, True), (0.0, False)]
    assert scores[0].scores == {"tests_passed": 3.0, "sandbox_error": 0.0,
                                "sandbox_started": 1.0}
    assert [s.scores["sandbox_started"] for s in scores[1:4]] == [0.0] * 3  # one sandbox
    assert scores[3].scores["sandbox_error"] == 1.0  # "no code" defines no function
    assert scores[4].error and "JSONDecodeError" in scores[4].error  # a bad row: counted


def test_one_runs_fork_bomb_does_not_stop_another_run_beside_it():
    bomb = "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n" \
           "        except OSError:\n            pass\n"
    results = {}
    threads = [threading.Thread(target=lambda: results.update(bomb=run_tests(
                   bomb, "add", ADD, Limits(wall_s=4)))),
               threading.Thread(target=lambda: results.update(plain=[run_tests(
                   "def add(a, b):\n    return a + b\n", "add", ADD) for _ in range(5)]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results["bomb"].passed == 0
    assert [r.passed for r in results["plain"]] == [3] * 5  # each run has a uid of its own


@pytest.mark.usefixtures("host_sentinel")
def test_forged_replies_and_a_full_pipe_do_not_outlast_the_wall_limit():
    forger = ("import os, time\n"
              "def add(a, b):\n"
              "    os.write(1, b'{\"value\": true}\\n' * 3000)\n"
              "    time.sleep(600)\n")
    tests = [{"args": [i, 1], "expected": 1} for i in range(20000)]  # more args than a pipe holds
    t0 = time.monotonic()
    result = run_tests(forger, "add", tests, Limits(wall_s=2))
    elapsed = time.monotonic() - t0
    record("a forger filling the pipe under a 2 s wall limit is stopped after s", elapsed, high=4)
    assert elapsed < 4
    assert result.passed == 0 and result.error == "timed out"  # true is not 1


@pytest.mark.usefixtures("host_sentinel")
def test_a_reply_nested_past_the_parsers_depth_scores_zero_without_an_error_escaping():
    # it answers its first test, then writes a reply nested past the parser's depth: the
    # parent takes no answer from it (the sandbox goes), and raises nothing
    deep = ("def add(a, b):\n    if [a, b] == [1, 2]:\n        return 3\n"
            "    import os; os.write(1, b'[' * 200000 + b']' * 200000 + b'\\n')\n")
    result = run_tests(deep, "add", ADD, Limits(wall_s=2))
    assert result.passed == 1 and result.error is not None


def test_a_sandbox_whose_caller_is_killed_dies_with_it():
    caller = subprocess.Popen([sys.executable, "-c", (
        "from tasks.sandbox import Limits, run_tests\n"
        "run_tests('import time\\ndef add(a, b):\\n    time.sleep(600)\\n', 'add',"
        " [{'args': [1, 2], 'expected': 3}], Limits(wall_s=600))\n")], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_processes(), "the sandbox never started"
    time.sleep(0.5)  # the solution is sleeping now
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 10
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    # the fixture checks that none is left


def test_it_refuses_to_run_as_another_user_than_root(monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    result = run_tests("def add(a, b):\n    return a + b\n", "add", ADD)
    assert result.passed == 0 and "runs only as root" in result.error


def code_rows(name: str) -> list[dict]:
    path = ROOT / "tasks" / "data" / "code" / name
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def code_reward():
    """tasks.code's reward, called in this process: its sandbox stopped before the check that
    nothing is left running."""
    yield unit_tests
    code._SANDBOX.close()


def test_a_golden_solution_passes_every_test_and_one_wrong_digit_fails_some(code_reward):
    rng = random.Random(0)
    for row in rng.sample(code_rows("eval.jsonl") + code_rows("train.jsonl"), 6):
        golden = code_reward(row["solution"], row["answer"], {})
        assert golden["acc"] and golden["reward"] == 1.0, row
        sloppy = corrupt_answer(row["solution"], 1.0, rng)
        assert sloppy != row["solution"]
        assert code_reward(sloppy, row["answer"], {})["reward"] < 1.0, (sloppy, row)
