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
from types import SimpleNamespace

import pytest

from rlvr.warm_start import corrupt_answer
from tasks import code, sandbox_jail
from tasks.code import unit_tests
from tasks.sandbox import UIDS, Limits, Result, Sandbox, _send, run_tests
from tasks.verifier import Verifier
from tests.calibration import record
from tests.conftest import ROOT

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


@pytest.mark.usefixtures("host_sentinel")
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
    elapsed = time.monotonic() - t0
    assert result.passed == 0 and result.error == "timed out"
    record("a fork bomb under a 3 s wall limit is stopped after s", elapsed, high=6)
    assert elapsed < 6


@pytest.mark.usefixtures("host_sentinel")
def test_children_that_leave_the_session_die_with_the_solution():
    escape = ("import os, time\n"
              "def add(a, b):\n"
              "    if os.fork() == 0:\n"
              "        os.setsid()\n"
              "        time.sleep(600)\n"
              "    return a + b\n")
    assert run_tests(escape, "add", ADD[:1]).passed == 1  # checked by the fixture: none left


def writer(victim: Path) -> str:
    """Writes to `victim` and three system folders, and to its own /tmp; passes its tests only
    when every write outside failed and its own succeeded (so a solution that never ran, or
    could write nowhere, does not pass)."""
    return ("import os\n"
            "def add(a, b):\n"
            "    wrote = []\n"
            f"    for path in [{str(victim)!r}, '/usr/escape', '/etc/escape', '/escape']:\n"
            "        try:\n"
            "            with open(path, 'w') as f:\n"
            "                f.write('owned')\n"
            "            wrote.append(path)\n"
            "        except OSError:\n"
            "            pass\n"
            "    with open('/tmp/own', 'w') as f:  # its own directory is writable\n"
            "        f.write('x')\n"
            "    return a + b if wrote == [] and os.path.exists('/tmp/own') else wrote\n")


def a_victim(folder: Path) -> Path:
    victim = folder / "tests.jsonl"
    victim.write_text("hidden\n")
    victim.chmod(0o666)
    return victim


def test_writing_outside_its_directory_changes_nothing(open_dir, host_sentinel):
    victim = a_victim(open_dir)
    assert run_tests(writer(victim), "add", ADD) == Result(3, 3)  # every write outside failed
    assert victim.read_text() == "hidden\n"
    assert not any(os.path.exists(p) for p in ("/usr/escape", "/etc/escape", "/escape"))


def test_control_the_writer_writes_a_file_the_jail_shows_it_writable(open_dir, monkeypatch):
    # the writer's attempts are real: with the victim's folder bound into the jail read-write,
    # its write lands and it fails its tests
    victim = a_victim(open_dir)
    monkeypatch.setattr("tasks.sandbox.visible_paths",
                        lambda: (*sandbox_jail.visible_paths(), str(open_dir)))
    monkeypatch.setattr(sandbox_jail, "MS_RDONLY", 0)
    assert run_tests(writer(victim), "add", ADD).passed == 0
    assert victim.read_text() == "owned"


def reader(stored: Path) -> str:
    """Looks for the expected values in a file of the tests, the garbage collector's objects and
    its caller's frame; returns a + b only if every attempt found nothing, else what found
    something."""
    return ("import gc, json, sys\n"
            "def add(a, b):\n"
            "    found = []\n"
            "    try:\n"
            f"        tests = json.load(open({str(stored)!r}))\n"
            "        found += ['file'] if any(t['args'] == [a, b] for t in tests) else []\n"
            "    except OSError:\n"
            "        pass\n"
            "    if any(isinstance(o, dict) and 'expected' in o for o in gc.get_objects()):\n"
            "        found.append('gc')\n"
            "    frame = sys._getframe(1)\n"
            "    if 'expected' in frame.f_locals or 'expected' in frame.f_globals:\n"
            "        found.append('frame')\n"
            "    return found or a + b\n")


def a_stored_test_file(folder: Path) -> Path:
    stored = folder / "hidden.json"
    stored.write_text(json.dumps(ADD))
    stored.chmod(0o644)
    return stored


def test_reading_the_tests_finds_nothing_to_copy(open_dir, host_sentinel):
    assert run_tests(reader(a_stored_test_file(open_dir)), "add", ADD) == Result(3, 3)


def test_control_the_reader_finds_the_tests_where_they_are_in_reach(open_dir, monkeypatch):
    stored = a_stored_test_file(open_dir)
    namespace: dict = {}
    exec(reader(stored), namespace)  # noqa: S102 - our own solution, in this process

    def caller(expected):  # a harness that held the expected value in its frame
        return namespace["add"](1, 2)

    assert caller(3) == ["file", "gc", "frame"]
    stored.unlink()
    assert caller(3) == ["gc", "frame"]
    stored = a_stored_test_file(open_dir)  # and in a jail that shows the file
    monkeypatch.setattr("tasks.sandbox.visible_paths",
                        lambda: (*sandbox_jail.visible_paths(), str(open_dir)))
    assert run_tests(reader(stored), "add", ADD).passed == 0


def test_sleeping_past_the_limit_scores_zero_within_the_limit():
    sleeper = "import time\ndef add(a, b):\n    time.sleep(600)\n"
    t0 = time.monotonic()
    result = run_tests(sleeper, "add", ADD, Limits(wall_s=2))
    elapsed = time.monotonic() - t0
    assert result.passed == 0 and result.error == "timed out"
    record("a sleeper under a 2 s wall limit is stopped after s", elapsed, high=4)
    assert elapsed < 4


@pytest.mark.parametrize("exit_call, error", [
    ("raise SystemExit(0)", None),  # caught as the test's exception: the next tests run too
    ("import os; os._exit(0)", "exited with code 0"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ("import os; os.close(1); return a + b", "exited with code 0")])
@pytest.mark.usefixtures("host_sentinel")
def test_exiting_the_interpreter_scores_no_test_after_it(exit_call, error):
    # it answers the first test, then exits: it ran, and its exit counts for no test after
    result = run_tests(f"def add(a, b):\n    if [a, b] == [1, 2]:\n        return 3\n"
                       f"    {exit_call}\n", "add", ADD)
    assert result == Result(1, 3, error)


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
@pytest.mark.usefixtures("host_sentinel")
def test_nothing_of_a_solution_reaches_the_next_in_one_sandbox(leftover):
    with Sandbox(Limits(wall_s=5)) as sandbox:
        assert sandbox.run(PROBE, "add", ADD).passed == 3
        sandbox.run(LEFTOVERS[leftover], "add", ADD)
        assert len(sandbox_processes()) == 2  # the harness and the process that reaps it
        assert sandbox.run(PROBE, "add", ADD) == Result(3, 3)
        assert sandbox.starts == 1  # the same sandbox went on


def test_control_without_its_pid_namespace_a_solution_signals_the_host_sentinel(host_sentinel,
                                                                                 monkeypatch):
    # the sentinel check can fail: with the sandbox left in the host's process ids, the same
    # solution reaches a process of its uid outside it
    monkeypatch.setattr(sandbox_jail, "CLONE_NEWPID", 0)
    host_sentinel.expect_harm = True
    run_tests(LEFTOVERS["signals every process"], "add", ADD)
    assert host_sentinel.harm() != []


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
