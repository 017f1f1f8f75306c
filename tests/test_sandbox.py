"""The code sandbox (tasks/sandbox.py), attacked by the solutions a policy could learn to write:
each attempt scores 0, and nothing outside the sandbox is changed or left running."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tasks import sandbox_jail
from tasks.sandbox import Limits, Result, Sandbox, run_tests
from tests.calibration import record
# the fixtures too: pytest finds them by name in this module
from tests.sandbox_guard import (ADD, PROBE, host_sentinel, nothing_left_running, open_dir,
                                 sandbox_processes)  # noqa: F401


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


# Each of these runs in the same sandbox as the probe (PROBE) after it; the probe passes only when nothing
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
