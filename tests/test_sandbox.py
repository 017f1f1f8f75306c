"""The code sandbox (tasks/sandbox.py), attacked by the solutions a policy could learn to write:
each attempt scores 0, and nothing outside the sandbox is changed or left running."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rlvr.warm_start import corrupt_answer
from tasks import code
from tasks.code import unit_tests
from tasks.sandbox import UIDS, Limits, Result, Sandbox, _send, run_tests
from tasks.verifier import Verifier
from tests.conftest import ROOT

ADD = [{"args": [1, 2], "expected": 3}, {"args": [5, 5], "expected": 10},
       {"args": [0, 0], "expected": 0}]


def sandbox_processes() -> list[str]:
    """Live processes of the sandbox's uids, machine-wide (a zombie has ended: it waits for the
    machine's init to reap it when its caller was killed)."""
    out = subprocess.run(["ps", "-e", "-o", "uid=,stat=,pid=,cmd="], capture_output=True,
                         text=True)
    return [line for line in out.stdout.splitlines()
            if UIDS[0] <= int(line.split()[0]) < UIDS[1] and not line.split()[1].startswith("Z")]


@pytest.fixture
def open_dir():
    """A folder anyone may read and write, outside the sandbox: only the jail keeps a solution
    out of it (pytest's own tmp folders are closed to other users anyway)."""
    path = tempfile.mkdtemp(prefix="rlvr-open-", dir="/tmp")
    os.chmod(path, 0o777)
    yield Path(path)
    shutil.rmtree(path)


@pytest.fixture(autouse=True)
def nothing_left_running():
    # machine-wide: every test that runs a sandbox lives in this module, so that pytest-xdist
    # (--dist loadscope) runs them one after another on one worker
    assert sandbox_processes() == []
    yield
    assert sandbox_processes() == []  # every process a solution started is gone with it


def test_a_right_answer_passes_every_test_and_a_wrong_one_none():
    assert run_tests("def add(a, b):\n    return a + b\n", "add", ADD).passed == 3
    assert run_tests("def add(a, b):\n    return a - b\n", "add", ADD).passed == 1
    assert run_tests("def add(a, b):\n    return (a + b, 0)\n", "add",
                     [{"args": [1, 2], "expected": [3, 0]}]).passed == 1  # via JSON, as stored


def test_a_solution_that_does_not_define_the_function_or_does_not_parse_scores_zero():
    assert run_tests("def plus(a, b):\n    return a + b\n", "add", ADD).error.startswith(
        "definition: KeyError")
    assert "SyntaxError" in run_tests("def add(a, b:\n", "add", ADD).error


def test_a_fork_bomb_scores_zero_and_leaves_no_process():
    bomb = ("import os\n"
            "def add(a, b):\n"
            "    while True:\n"
            "        try:\n"
            "            os.fork()\n"
            "        except OSError:\n"
            "            pass\n")
    t0 = time.monotonic()
    result = run_tests(bomb, "add", ADD, Limits(wall_s=3))
    assert result.passed == 0 and result.error == "timed out"
    assert time.monotonic() - t0 < 6


def test_children_that_leave_the_session_die_with_the_solution():
    escape = ("import os, time\n"
              "def add(a, b):\n"
              "    if os.fork() == 0:\n"
              "        os.setsid()\n"
              "        time.sleep(600)\n"
              "    return a + b\n")
    assert run_tests(escape, "add", ADD[:1]).passed == 1  # checked by the fixture: none left


def test_writing_outside_its_directory_changes_nothing(open_dir):
    victim = open_dir / "tests.jsonl"
    victim.write_text("hidden\n")
    victim.chmod(0o666)
    own = f"/tmp/rlvr-escape-{os.getpid()}"  # its own /tmp: private to the sandbox
    writer = ("def add(a, b):\n"
              "    wrote = 0\n"
              f"    for path in [{str(victim)!r}, '/usr/escape', '/etc/escape', '/escape']:\n"
              "        try:\n"
              "            open(path, 'w').write('owned')\n"
              "            wrote += 1\n"
              "        except OSError:\n"
              "            pass\n"
              f"    open({own!r}, 'w').write('x')  # its own directory is writable\n"
              "    return a + b if wrote else None\n")
    result = run_tests(writer, "add", ADD)
    assert result.passed == 0 and result.error is None
    assert victim.read_text() == "hidden\n"
    assert not any(os.path.exists(p) for p in (own, "/usr/escape", "/etc/escape", "/escape"))


def test_reading_the_tests_finds_nothing_to_copy(open_dir):
    stored = open_dir / "hidden.json"
    stored.write_text(json.dumps(ADD))
    stored.chmod(0o644)
    reader = ("import gc, json, sys\n"
              "def add(a, b):\n"
              "    try:\n"
              f"        tests = json.load(open({str(stored)!r}))\n"
              "        return next(t['expected'] for t in tests if t['args'] == [a, b])\n"
              "    except OSError:\n"
              "        pass\n"
              "    for obj in gc.get_objects():\n"
              "        if isinstance(obj, dict) and 'expected' in obj:\n"
              "            return obj['expected']\n"
              "    frame = sys._getframe(1)\n"
              "    return frame.f_locals.get('expected', frame.f_globals.get('expected'))\n")
    assert run_tests(reader, "add", ADD).passed == 0


def test_sleeping_past_the_limit_scores_zero_within_the_limit():
    sleeper = "import time\ndef add(a, b):\n    time.sleep(600)\n"
    t0 = time.monotonic()
    result = run_tests(sleeper, "add", ADD, Limits(wall_s=2))
    assert result.passed == 0 and result.error == "timed out"
    assert time.monotonic() - t0 < 4


@pytest.mark.parametrize("exit_call", ["raise SystemExit(0)", "import os; os._exit(0)",
                                       "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                                       "import os; os.close(1); return a + b"])
def test_exiting_the_interpreter_scores_zero(exit_call):
    result = run_tests(f"def add(a, b):\n    {exit_call}\n", "add", ADD)
    assert result.passed == 0


# Each of these runs in the same sandbox as the probe after it; the probe passes only when nothing
# of the one before reached it: /tmp empty, the harness's modules as they were, no process left.
LEFTOVERS = {
    "leaves a process": "import os, time\ndef add(a, b):\n    if os.fork() == 0:\n"
                        "        os.setsid()\n        time.sleep(600)\n    return a + b\n",
    "leaves a closed folder": "import os\nos.makedirs('/tmp/a/b')\nopen('/tmp/a/b/x', 'w')\n"
                              "os.chmod('/tmp/a/b', 0)\nos.chmod('/tmp/a', 0)\n"
                              "def add(a, b):\n    return a + b\n",
    "fills /tmp": "def add(a, b):\n    for i in range(10):\n        try:\n"
                  "            open(f'/tmp/{i}', 'wb').write(b'x' * 10 ** 6)\n"
                  "        except OSError:\n            pass\n    return a + b\n",
    "patches the modules": "import json, builtins\njson.dumps = lambda *a, **k: '{\"value\": 0}'\n"
                           "json.loads = lambda s: [0, 0]\nbuiltins.len = None\n"
                           "def add(a, b):\n    return a + b\n",
    "signals every process": "import os, signal\ndef add(a, b):\n"
                             "    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP,\n"
                             "                signal.SIGINT):\n"
                             "        for pid in (-1, 1, os.getppid()):\n"
                             "            try:\n                os.kill(pid, sig)\n"
                             "            except OSError:\n                pass\n    return a + b\n",
    "exits": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "dies by a real-time signal": "import os\ndef add(a, b):\n    os.kill(os.getpid(), 40)\n",
}
PROBE = ("import os\n"
         "def add(a, b):\n"
         "    return a + b if os.listdir('/tmp') == [] and len('ab') == 2 else None\n")


@pytest.mark.parametrize("leftover", list(LEFTOVERS))
def test_nothing_of_a_solution_reaches_the_next_in_one_sandbox(leftover):
    with Sandbox(Limits(wall_s=5)) as sandbox:
        assert sandbox.run(PROBE, "add", ADD).passed == 3
        sandbox.run(LEFTOVERS[leftover], "add", ADD)
        assert len(sandbox_processes()) == 2  # the harness and the process that reaps it
        assert sandbox.run(PROBE, "add", ADD) == Result(3, 3)
        assert sandbox.starts == 1  # the same sandbox went on


def test_a_solution_past_the_wall_limit_costs_its_sandbox_and_the_next_run_starts_one():
    with Sandbox(Limits(wall_s=2)) as sandbox:
        sleeper = "import time\ndef add(a, b):\n    time.sleep(600)\n"
        assert sandbox.run(sleeper, "add", ADD) == Result(0, 3, "timed out")
        assert sandbox_processes() == []  # killed whole
        assert sandbox.run(PROBE, "add", ADD) == Result(3, 3)
        assert sandbox.starts == 2


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
# fails the write, harmlessly), for what the solution before it returned and for its source.
SCANNER = r"""
import ctypes, os, re
def add(a, b):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.malloc.restype = ctypes.c_void_p
    libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    r, w = os.pipe()
    wanted = re.compile(rb"EARLIE[R]_\d+_\d+|SOURCE_OF_EARLIE[R]")  # not itself
    found = 0
    for centre in (id(object()), id(re), libc.malloc(64),
                   ctypes.addressof(ctypes.create_string_buffer(100000))):
        base = (centre & ~0xFFF) - (64 << 20)
        for page in range(base, base + (128 << 20), 4096):
            if libc.write(w, page, 4096) == 4096:
                found += bool(wanted.search(os.read(r, 4096)))
    return a + b if found == 0 else -found
"""
# longer than the scanner, so that the scanner's own source, read where it was, does not cover it
EARLIER = ("def add(a, b):\n"
           "    return 'EARLIER_%d_%d' % (a, b)\n" + "#" * 4000 + "\n# SOURCE_OF_EARLIER\n")


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


def test_the_network_is_out_of_reach():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    caller = ("import socket\n"
              "def add(a, b):\n"
              f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
              "    return a + b\n")
    try:
        result = run_tests(caller, "add", ADD[:1])
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
    assert result.passed == 0


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


def test_forged_replies_and_a_full_pipe_do_not_outlast_the_wall_limit():
    forger = ("import os, time\n"
              "def add(a, b):\n"
              "    os.write(1, b'{\"value\": true}\\n' * 3000)\n"
              "    time.sleep(600)\n")
    tests = [{"args": [i, 1], "expected": 1} for i in range(20000)]  # more args than a pipe holds
    t0 = time.monotonic()
    result = run_tests(forger, "add", tests, Limits(wall_s=2))
    assert time.monotonic() - t0 < 4
    assert result.passed == 0 and result.error == "timed out"  # true is not 1


def test_a_reply_nested_past_the_parsers_depth_scores_zero_without_an_error_escaping():
    deep = "def add(a, b):\n    import os; os.write(1, b'[' * 200000 + b']' * 200000 + b'\\n')\n"
    assert run_tests(deep, "add", ADD[:1], Limits(wall_s=2)).passed == 0


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
