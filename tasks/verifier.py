"""Rewards: is a response's last \\boxed{...} answer equal to the reference answer (math-verify)?

Why a child process: math-verify bounds its time with `signal.alarm`, which works only in a
process's main thread, and some inputs make sympy compute for minutes inside C code that no
signal interrupts. So `Verifier` runs the checks in one long-lived child process whose main
thread bounds each item with its own timer; the parent bounds each item again from outside and
kills and restarts a child that hangs or dies. `score` can be called from any thread.

The child is a fresh interpreter (`python -m tasks.verifier --serve ...`), not a
multiprocessing child: multiprocessing's spawn/forkserver re-run the parent's main script in the
child, which breaks unguarded user scripts and re-imports whatever the entry point imports
(torch). Requests and replies are JSON lines over the child's stdin/stdout: plain lists of
strings in, one "1"/"0" line per item out (stray prints in the child go to stderr).

Per call, one request carries the whole batch; the child streams back one line per item so that
after a hang the parent knows which item hung: that item scores False, the rest of the batch goes
to a fresh child (at most `max_restarts` restarts per call; items still left then score False),
and a warning names how many items were lost.

Fast paths in the parent, no child needed: a response with no \\boxed{...} scores False (the task
asks for the answer in \\boxed{}), and a boxed text equal to the answer scores True.

What math-verify 0.9 says (asserted in tests/test_verifier.py): `\\boxed{432}` vs "432" True,
`\\boxed{433}` False, `\\boxed{1/2}` and `\\boxed{\\frac{1}{2}}` vs "0.5" True, `\\boxed{432.0}`
vs "432" True, `\\boxed{1,000}` vs "1000" True, `\\boxed{4,32}` vs "432" False (a set).

Run `python -m tasks.verifier` for a smoke check.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

_BOXED = "\\boxed{"
_GRACE_S = 2.0
"""Slack the parent allows per item on top of the child's own per-item bound (IPC, GC, load)."""
_MATH_VERIFY = "tasks.verifier:math_equal"


def extract_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` in `text` (braces balanced), or None.

    A `\\boxed{` whose braces never close (a truncated response) is skipped; `\\{` and `\\}` are
    escaped braces and do not count.
    """
    found = None
    i = text.find(_BOXED)
    while i != -1:
        start = i + len(_BOXED)
        depth, j = 1, start
        while j < len(text) and depth:
            if text[j] == "\\":
                j += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:  # unbalanced: no later \boxed can close either, keep what we have
            break
        found = text[start : j - 1]
        i = text.find(_BOXED, j)
    return found


def quick_verdict(response: str, answer: str) -> bool | None:
    """The verdict when the text alone settles it, without math-verify: no complete \\boxed{}
    is False, a boxed text equal to the answer is True; None = math-verify must judge."""
    boxed = extract_boxed(response)
    if boxed is None:
        return False
    return True if boxed.strip() == answer.strip() else None


def math_equal(boxed: str, answer: str) -> bool:
    """math-verify's verdict on a boxed prediction against a reference answer.

    Runs inside the child: math-verify's own signal timeouts are off (the child's per-item timer
    bounds the whole check instead, and math-verify's `alarm(0)` would cancel it).
    """
    from math_verify import parse, verify

    gold = parse("$" + answer + "$", parsing_timeout=None)
    pred = parse(_BOXED + boxed + "}", parsing_timeout=None)
    return bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)


# ---- child side ------------------------------------------------------------------------------


class _ItemTimeout(BaseException):
    """Raised by the child's timer; a BaseException so library `except Exception` cannot eat it."""


def _on_alarm(signum, frame):
    raise _ItemTimeout


def _bounded(check: Callable[[str, str], bool], boxed: str, answer: str, timeout_s: float) -> bool:
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return bool(check(boxed, answer))
    except (_ItemTimeout, Exception):
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _resolve(ref: str) -> Callable[[str, str], bool]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _serve(timeout_s: float, check_ref: str) -> None:
    """Child loop: read a JSON request line, write one "1"/"0" line per item, until EOF."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol channel
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGALRM, _on_alarm)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice
    check = _resolve(check_ref)
    _bounded(check, "1", "1", max(timeout_s, 30.0))  # import and warm up before saying ready
    replies.write("ready\n")
    while line := sys.stdin.readline():
        request = json.loads(line)
        for boxed, answer in zip(request["boxed"], request["answers"]):
            replies.write("1\n" if _bounded(check, boxed, answer, timeout_s) else "0\n")


# ---- parent side -----------------------------------------------------------------------------


class _Child:
    """One child process and its pipes; `read_line` waits at most a given time."""

    def __init__(self, timeout_s: float, check_ref: str):
        path = [p or os.getcwd() for p in sys.path]  # so the child imports what the parent can
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tasks.verifier", "--serve", repr(timeout_s), check_ref],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        self.ready = False
        self._buffer = b""

    def send(self, boxed: list[str], answers: list[str]) -> None:
        data = memoryview((json.dumps({"boxed": boxed, "answers": answers}) + "\n").encode())
        while data:  # a raw pipe write may be partial
            data = data[self.proc.stdin.write(data) :]

    def read_line(self, timeout_s: float) -> str | None:
        """The next line, or None if none arrives in `timeout_s` or the child closed stdout."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def stop(self, grace_s: float = 0.0) -> None:
        """Close stdin (the child exits at EOF), wait up to `grace_s`, then kill."""
        try:
            self.proc.stdin.close()
            self.proc.wait(grace_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


class Verifier:
    """Scores responses against reference answers with math-verify in a child process."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        *,
        check: Callable[[str, str], bool] | None = None,
        startup_timeout_s: float = 120.0,
        max_restarts: int = 2,
    ):
        """`timeout_s` bounds one item's check. `check` replaces math-verify (tests): a
        module-level function of an importable module (the child imports it by name).
        `max_restarts` bounds child restarts within one `score` call."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if check is None:
            self._check_ref = _MATH_VERIFY
        elif check.__module__ == "__main__" or not check.__qualname__.isidentifier():
            raise ValueError("check must be a module-level function of an importable module")
        else:
            self._check_ref = f"{check.__module__}:{check.__qualname__}"
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.restarts = 0
        """Child restarts so far (hangs and crashes), for metrics."""
        self._lock = threading.Lock()
        self._closed = False
        self._child: _Child | None = _Child(timeout_s, self._check_ref)  # starts in the background

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> list[bool]:
        """One bool per response: its last \\boxed{...} equals the matching answer."""
        if self._closed:
            raise RuntimeError("Verifier is closed")
        if len(responses) != len(answers):
            raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
        results = [False] * len(responses)
        boxed_of: dict[int, str] = {}
        for i, (response, answer) in enumerate(zip(responses, answers)):
            verdict = quick_verdict(response, answer)
            if verdict is None:
                boxed_of[i] = extract_boxed(response)
            else:
                results[i] = verdict
        if boxed_of:
            with self._lock:
                if self._closed:  # closed by another thread meanwhile
                    raise RuntimeError("Verifier is closed")
                self._score_in_child(list(boxed_of), boxed_of, answers, results)
        return results

    def _score_in_child(
        self, todo: list[int], boxed_of: dict[int, str], answers: Sequence[str], results: list[bool]
    ) -> None:
        lost = restarts = 0
        while todo:
            child = self._ready_child()
            try:
                child.send([boxed_of[i] for i in todo], [answers[i] for i in todo])
            except OSError:  # the child died between calls: nothing was in flight, resend all
                what, done = "had died", -1
            else:
                done = self._collect(child, todo, results)
                if done == len(todo):
                    break
                what = "hung" if child.proc.poll() is None else f"died (exit {child.proc.poll()})"
                lost += 1  # the item in flight scores False
            todo = todo[done + 1 :]
            child.stop()
            self._child = None
            restarts += 1
            self.restarts += 1
            log.warning("verifier child %s; restarting it (%d this call)", what, restarts)
            if restarts > self.max_restarts:
                lost += len(todo)
                break
        if lost:
            log.warning("verifier: %d item(s) scored False after child hangs or crashes", lost)

    def _collect(self, child: _Child, todo: list[int], results: list[bool]) -> int:
        """Read results in order until done or the child stalls; returns how many arrived."""
        for done, i in enumerate(todo):
            line = child.read_line(self.timeout_s + _GRACE_S)
            if line not in ("0", "1"):
                return done
            results[i] = line == "1"
        return len(todo)

    def _ready_child(self) -> _Child:
        """The child, (re)started if needed, once it has said it is ready."""
        if self._child is None:
            self._child = _Child(self.timeout_s, self._check_ref)
        child = self._child
        if not child.ready:
            if child.read_line(self.startup_timeout_s) != "ready":
                code = child.proc.poll()
                child.stop()
                self._child = None
                state = "did not start" if code is None else f"exited with code {code} at start"
                raise RuntimeError(f"verifier child {state} (within {self.startup_timeout_s} s)")
            child.ready = True
        return child

    def close(self) -> None:
        """Stop the child (EOF first, then by force). Safe to call twice."""
        with self._lock:
            self._closed = True
            if self._child is not None:
                self._child.stop(grace_s=2.0)
                self._child = None


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve(float(sys.argv[2]), sys.argv[3])
    else:
        logging.basicConfig(level=logging.INFO)
        with Verifier() as verifier:
            responses = ["so \\boxed{432}", "\\boxed{1/2}", "no box", "\\boxed{433}"]
            print(verifier.score(responses, ["432", "0.5", "1", "432"]))
