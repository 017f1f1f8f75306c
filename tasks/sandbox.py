"""Run untrusted Python (a model's solution) against hidden input/output tests, in a process that
cannot reach the network, the tests, other files or the machine's processes.

    result = run_tests(solution_text, "add", [{"args": [1, 2], "expected": 3}, ...])
    result.passed, result.total, result.error

Why this shape:
- The tests never enter the solution's process. The parent (trusted) sends each test's
  arguments over a pipe and compares the returned value with the expected one itself, so a
  solution that inspects its caller's frame, the garbage collector or the files around it finds
  no expected value to copy.
- The solution runs as a fresh interpreter (`python -I -S`: no site, no environment) in its
  own session, with limits set before it starts: CPU seconds, address space, file size, open
  files, processes (a fork bomb meets RLIMIT_NPROC). It runs in new Linux namespaces: a network
  namespace (only a loopback, down), its own process ids (it is pid 1 there, so whatever it
  starts dies with it), and a mount namespace whose root is a jail: the system's libraries and
  the interpreter's prefix, read-only, and an empty /tmp, its working directory. Nothing else
  of the machine (the project, the data, the run folder, /proc) is there. It then drops root for
  a uid of its own, picked at random per run (RLIMIT_NPROC counts a uid's processes across the
  machine, and root ignores it), so it holds no capability to undo any of this. It runs only as
  root: a user namespace would leave the solution the capabilities to leave its chroot.
- The parent bounds the whole run by wall time, writes included, and kills the solution at the
  end, whatever it did (sleep, exit, spawn children); a sandbox whose caller dies is killed too.

If the namespaces cannot be created the run fails closed: every test scores 0 with the reason.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # the whole run: start, definition, every test
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 1
    processes: int = 16  # of the run's own uid
    open_files: int = 64


@dataclass(frozen=True)
class Result:
    passed: int
    total: int
    error: str | None = None  # why the run stopped early (timeout, crash, no function, ...)


# ---- the solution's side: runs in the sandboxed interpreter ----------------------------------

_CHILD = r"""
import os
# the solution runs as pid 1 of a new pid namespace: when it ends or is killed, the kernel kills
# every process it started there, setsid or not
pid = os.fork()
if pid == 0:  # killed when the process above dies (that one dies with the caller)
    import ctypes
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
if pid:  # the parent kills the solution by this pid, then this process reaps it and ends
    os.write(1, b'{"pid": %d}\n' % pid)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF)
import json, sys
channel_in, channel_out = sys.stdin, sys.__stdout__
sys.stdout = sys.stderr  # the solution's prints stay out of the replies
request = json.loads(channel_in.readline())
namespace = {"__name__": "solution"}
try:
    exec(compile(request["source"], "solution.py", "exec"), namespace)
    fn = namespace[request["function"]]
except BaseException as e:
    channel_out.write(json.dumps({"error": f"definition: {type(e).__name__}: {e}"[:300]}) + "\n")
    channel_out.flush()
    raise SystemExit(0)
channel_out.write('{"ready": true}\n'); channel_out.flush()
for line in channel_in:
    try:
        reply = {"value": fn(*json.loads(line))}
        text = json.dumps(reply)
    except BaseException as e:
        text = json.dumps({"raised": type(e).__name__})
    channel_out.write(text + "\n"); channel_out.flush()
"""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096


def _bind_read_only(libc, source: str, jail: str) -> None:
    """`source` at the same path inside the jail, read-only (a symlink stays a symlink)."""
    target = jail + source
    if os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
        return
    os.makedirs(target, exist_ok=True)
    _check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None),
           f"bind {source}")
    _check(libc.mount(None, target.encode(), None,
                      MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
           f"read-only {source}")


PR_SET_PDEATHSIG = 1
UIDS = (1 << 20, 1 << 21)
"""Each run takes a uid at random from here (no account needs to exist): RLIMIT_NPROC counts a
uid's processes machine-wide, so runs at once (several actors, the learner's evaluation) must
not share one, as they would sharing `nobody` (one solution's fork bomb would stop the others)."""


def _confine(limits: Limits, jail: str, visible: tuple[str, ...], uid: int) -> None:
    """preexec_fn, in the child before exec: new namespaces, a jail that holds only `visible`
    (read-only) and an empty /tmp, limits, and a uid of its own without privileges."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    _check(libc.mount(b"tmpfs", jail.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                      f"size={limits.file_mb * 4 + 1}m,mode=755".encode()), "tmpfs jail")
    for path in visible:
        _bind_read_only(libc, path, jail)
    os.mkdir(jail + "/tmp", 0o1777)
    os.chmod(jail + "/tmp", 0o1777)
    os.chdir(jail)
    _check(libc.chroot(b"."), "chroot")
    os.chdir("/tmp")
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # every capability goes with root: no chroot, mount or unshare from here
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # after setuid,
    # which clears it: if the caller dies, so does the sandbox


def _visible() -> tuple[str, ...]:
    """What the jail shows: the system's libraries and the interpreter's own prefix."""
    paths = [p for p in ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32")
             if os.path.lexists(p)]
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)
    return tuple(paths)


# ---- the parent's side -----------------------------------------------------------------------


def run_tests(source: str, function: str, tests: list[dict], limits: Limits = Limits()) -> Result:
    """How many of `tests` ({"args": [...], "expected": value}) `function` defined by `source`
    passes, run in the sandbox. A test passes when the returned value equals `expected` after a
    JSON round trip (tuples as lists)."""
    if os.getuid() != 0:
        return Result(0, len(tests), NOT_ROOT)
    uid = random.SystemRandom().randrange(*UIDS)
    jail = tempfile.mkdtemp(prefix="rlvr-sandbox-")  # a mount point, empty outside the child
    try:
        proc = subprocess.Popen(
            [os.path.realpath(sys.executable), "-I", "-S", "-c", _CHILD], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={}, start_new_session=True,
            preexec_fn=lambda: _confine(limits, jail, _visible(), uid), bufsize=0)
    except (OSError, subprocess.SubprocessError) as e:
        os.rmdir(jail)
        return Result(0, len(tests), f"sandbox did not start: {e}")
    os.set_blocking(proc.stdin.fileno(), False)  # a write waits under the deadline, as reads do
    deadline = time.monotonic() + limits.wall_s
    reader = _Lines(proc.stdout.fileno())
    passed, error, solution = 0, None, None
    try:
        solution = (reader.next(deadline) or {}).get("pid")
        if not isinstance(solution, int):  # nothing to kill it by: do not start it
            raise _Stop(_ended(proc, deadline))
        _send(proc, {"source": source, "function": function}, deadline)
        first = reader.next(deadline)
        if first is None or "ready" not in first:
            raise _Stop((first or {}).get("error") or _ended(proc, deadline))
        for test in tests:
            _send(proc, test["args"], deadline)
            reply = reader.next(deadline)
            if reply is None:
                raise _Stop(_ended(proc, deadline))
            passed += "value" in reply and _same(reply["value"], test["expected"])
    except _Stop as stop:
        error = stop.why
    except OSError:  # the solution closed its end (exited)
        error = _ended(proc, deadline)
    finally:
        _kill(proc, solution)
        os.rmdir(jail)
    return Result(passed, len(tests), error)


NOT_ROOT = ("the sandbox runs only as root (it gives each run a uid of its own and drops every "
            "privilege); as another user a solution could undo its chroot")


class _Stop(Exception):
    def __init__(self, why: str):
        self.why = why


def _same(value, expected) -> bool:
    """Equal as JSON text: True is not 1, 1.0 is not 1 (a wrong type is a wrong answer)."""
    return json.dumps(value, sort_keys=True) == json.dumps(expected, sort_keys=True)


def _send(proc: subprocess.Popen, obj, deadline: float) -> None:
    data = memoryview((json.dumps(obj) + "\n").encode())
    fd = proc.stdin.fileno()
    while data:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
            raise _Stop("timed out")
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            continue


class _Lines:
    """JSON replies from the child's stdout, each waited for until a deadline."""

    def __init__(self, fd: int):
        self.fd, self.buffer = fd, b""

    def next(self, deadline: float) -> dict | None:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
            if len(self.buffer) > 1 << 20:  # a reply that large is not an answer
                return None
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return None
        return reply if isinstance(reply, dict) else None


def _ended(proc: subprocess.Popen, deadline: float) -> str:
    if time.monotonic() >= deadline:
        return "timed out"
    try:
        code = proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _kill(proc: subprocess.Popen, solution: int | None) -> None:
    """The solution first (pid 1 of its namespace: the kernel takes every process it started
    with it, and the process above reaps it), then whatever is left of the session."""
    for pid, kill in ((solution, os.kill), (proc.pid, os.killpg)):
        if pid is None:
            continue
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
