"""Rewards in a child process: the built-in math verdict (is a response's last \\boxed{...}
answer equal to the reference under math-verify?) or the user's own function (`task.reward`,
tasks/rewards.py).

Why a child process: math-verify bounds its time with `signal.alarm`, which works only in a
process's main thread, and some inputs make sympy compute for minutes inside C code that no
signal interrupts; a user's reward function may hang, crash or print as well. So `Verifier` runs
the checks in one long-lived child process whose main thread bounds each item with its own
timer; the parent bounds each item again from outside and kills and restarts a child that hangs
or dies. `score` and `judge` can be called from any thread.

The child is a fresh interpreter (`python -m tasks.verifier --serve ...`), not a
multiprocessing child: multiprocessing's spawn/forkserver re-run the parent's main script in the
child, which breaks unguarded user scripts and re-imports whatever the entry point imports
(torch). Requests and replies are JSON lines over the child's stdin/stdout: one request per
batch, one reply line per item (a `Score` as JSON; stray prints in the child go to stderr).

The child streams back one line per item so that after a hang the parent knows which item hung:
that item scores 0 with an error, the rest of the batch goes to a fresh child (at most
`max_restarts` restarts per call; items still left then score 0), and a warning names how many
items were lost. An item whose function raised or returned something unusable scores 0 with
the reason (`Score.error`); the first such reason is logged once, traceback included.

Fast paths of the built-in reward, in the parent, no child needed: a response with no
\\boxed{...} scores 0 (the task asks for the answer in \\boxed{}), and a boxed text equal to the
answer scores 1.

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
import traceback
from collections.abc import Callable, Sequence

from tasks import rewards
from tasks.math_answer import extract_boxed, quick_verdict
from tasks.rewards import BUILTIN, Score

log = logging.getLogger(__name__)

_GRACE_S = 2.0
"""Slack the parent allows per item on top of the child's own per-item bound (IPC, GC, load)."""
_MATH_VERIFY = "tasks.math_answer:math_equal"


# ---- child side ------------------------------------------------------------------------------


class _ItemTimeout(BaseException):
    """Raised by the child's timer; a BaseException so library `except Exception` cannot eat it."""


def _on_alarm(signum, frame):
    raise _ItemTimeout


def _bounded(judge: Callable[[str, str, dict], Score], text: str, answer: str, fields: dict,
             timeout_s: float) -> Score:
    timed_out = Score.failed(f"timed out after {timeout_s} s")
    try:  # the outer catch: the timer can fire in the handlers below, before it is disarmed
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return judge(text, answer, fields)
        except _ItemTimeout:
            return timed_out
        except Exception:  # noqa: BLE001 - the reward function's own error scores 0, with why
            return Score.failed(traceback.format_exc(limit=-8).strip())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _ItemTimeout:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return timed_out


def _judge_of(check_ref: str, reward_ref: str) -> Callable[[str, str, dict], Score]:
    """The child's per-item function. The built-in reward receives the boxed text (the parent
    extracts it); a user's function receives the whole response."""
    if reward_ref == BUILTIN:
        module, _, name = check_ref.partition(":")
        check = getattr(importlib.import_module(module), name)
        return lambda boxed, answer, fields: Score.of_acc(bool(check(boxed, answer)))
    return rewards.resolve_judge(reward_ref)


def _serve(timeout_s: float, check_ref: str, reward_ref: str) -> None:
    """Child loop: read a JSON request line, write one Score line per item, until EOF."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol channel
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGALRM, _on_alarm)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice
    judge = _judge_of(check_ref, reward_ref)
    if reward_ref == BUILTIN:  # import math-verify and warm it up before saying ready
        _bounded(judge, "1", "1", {}, max(timeout_s, 30.0))
    replies.write("ready\n")
    while line := sys.stdin.readline():
        request = json.loads(line)
        for text, answer, fields in request["items"]:
            score = _bounded(judge, text, answer, fields, timeout_s)
            replies.write(json.dumps(score.as_json()) + "\n")


# ---- parent side -----------------------------------------------------------------------------


class _Child:
    """One child process and its pipes; `read_line` waits at most a given time."""

    def __init__(self, timeout_s: float, check_ref: str, reward_ref: str):
        path = [p or os.getcwd() for p in sys.path]  # so the child imports what the parent can
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tasks.verifier", "--serve", repr(timeout_s), check_ref,
             reward_ref],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        self.ready = False
        self._buffer = b""

    def send(self, items: list[tuple[str, str, dict]]) -> None:
        data = memoryview((json.dumps({"items": items}, default=str) + "\n").encode())
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


def _fate(proc: subprocess.Popen) -> str:
    """What became of a child that stopped replying: its exit status can lag its stdout's end."""
    try:
        return f"died (exit {proc.wait(timeout=0.2)})"
    except subprocess.TimeoutExpired:
        return "hung"


class Verifier:
    """Scores responses against reference answers in a child process: with math-verify, or with
    the reward function `reward` names (tasks/rewards.py)."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        *,
        reward: str = BUILTIN,
        check: Callable[[str, str], bool] | None = None,
        startup_timeout_s: float = 120.0,
        max_restarts: int = 2,
    ):
        """`timeout_s` bounds one item's check. `reward`: "package.module:function" of a reward
        function, or the built-in math_verify. `check` replaces math-verify inside the built-in
        reward (tests): a module-level (boxed, answer) -> bool of an importable module (the
        child imports it by name). `max_restarts` bounds child restarts within one call."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if check is None:
            self._check_ref = _MATH_VERIFY
        elif check.__module__ == "__main__" or not check.__qualname__.isidentifier():
            raise ValueError("check must be a module-level function of an importable module")
        else:
            self._check_ref = f"{check.__module__}:{check.__qualname__}"
        if reward != BUILTIN:
            rewards.resolve_judge(reward)  # a bad name fails here, in one line, not in the child
        self.reward = reward
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.restarts = 0
        """Child restarts so far (hangs and crashes), for metrics."""
        self.errors = 0
        """Items scored 0 for an error (raised, bad value, timeout, lost child) so far."""
        self._first_error_logged = False
        self._lock = threading.Lock()
        self._closed = False
        self._child: _Child | None = self._new_child()  # starts in the background

    def _new_child(self) -> _Child:
        return _Child(self.timeout_s, self._check_ref, self.reward)

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> list[bool]:
        """One verdict per response: is it correct (the reward function's `acc`)?"""
        return [s.acc for s in self.judge(responses, answers)]

    def judge(self, responses: Sequence[str], answers: Sequence[str],
              fields: Sequence[dict] | None = None) -> list[Score]:
        """One Score per response, against the matching answer (and the prompt's fields)."""
        if self._closed:
            raise RuntimeError("Verifier is closed")
        if len(responses) != len(answers) or (fields is not None and len(fields) != len(answers)):
            raise ValueError(f"{len(responses)} responses but {len(answers)} answers"
                             + ("" if fields is None else f" and {len(fields)} fields"))
        results: list[Score | None] = [None] * len(responses)
        items: dict[int, tuple[str, str, dict]] = {}
        for i, (response, answer) in enumerate(zip(responses, answers)):
            row = {} if fields is None else fields[i]
            if self.reward != BUILTIN:
                items[i] = (response, answer, row)
            elif (verdict := quick_verdict(response, answer)) is None:
                items[i] = (extract_boxed(response), answer, row)
            else:
                results[i] = Score.of_acc(verdict)
        if items:
            with self._lock:
                if self._closed:  # closed by another thread meanwhile
                    raise RuntimeError("Verifier is closed")
                self._score_in_child(list(items), items, results)
        for score in results:
            if score.error is not None:
                self._count_error(score.error)
        return results

    def _count_error(self, why: str) -> None:
        self.errors += 1
        if not self._first_error_logged:
            self._first_error_logged = True
            log.warning("reward %s scored 0 (counted in reward/errors; only the first is "
                        "logged):\n%s", self.reward, why)

    def _score_in_child(self, todo: list[int], items: dict[int, tuple[str, str, dict]],
                        results: list[Score | None]) -> None:
        lost = restarts = 0
        while todo:
            child = self._ready_child()
            try:
                child.send([items[i] for i in todo])
            except OSError:  # the child died between calls: nothing was in flight, resend all
                what, done = "had died", -1
            else:
                done = self._collect(child, todo, results)
                if done == len(todo):
                    break
                what = _fate(child.proc)
                results[todo[done]] = Score.failed(f"the verifier child {what} on it")
                lost += 1
            todo = todo[done + 1 :]
            child.stop()
            self._child = None
            restarts += 1
            self.restarts += 1
            log.warning("verifier child %s; restarting it (%d this call)", what, restarts)
            if restarts > self.max_restarts:
                for i in todo:
                    results[i] = Score.failed(f"not scored: {restarts} child restarts this call")
                lost += len(todo)
                break
        if lost:
            log.warning("verifier: %d item(s) scored 0 after child hangs or crashes", lost)

    def _collect(self, child: _Child, todo: list[int], results: list[Score | None]) -> int:
        """Read results in order until done or the child stalls; returns how many arrived."""
        for done, i in enumerate(todo):
            line = child.read_line(self.timeout_s + _GRACE_S)
            try:
                results[i] = Score.from_json(json.loads(line))
            except (TypeError, ValueError, KeyError):  # None (stalled) or not a reply
                return done
        return len(todo)

    def _ready_child(self) -> _Child:
        """The child, (re)started if needed, once it has said it is ready."""
        if self._child is None:
            self._child = self._new_child()
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
        try:
            _serve(float(sys.argv[2]), sys.argv[3], sys.argv[4])
        except BrokenPipeError:  # the parent is gone (it exited or was killed): nobody to answer
            os._exit(0)
    else:
        logging.basicConfig(level=logging.INFO)
        with Verifier() as verifier:
            responses = ["so \\boxed{432}", "\\boxed{1/2}", "no box", "\\boxed{433}"]
            print(verifier.score(responses, ["432", "0.5", "1", "432"]))
