"""The sandbox's harness (tasks/sandbox.py): the sandbox's interpreter runs this file,
`python -I -S -c <its text> CPU_S`, already confined and without privileges. Never imported.

Its first process only reports the harness's pid to the parent and reaps it. The harness, pid 1
of the sandbox's pid namespace, reads the parent's requests, a line of JSON each:
- {"source", "function"}: fork a solution's process, relay its first reply (ready, or why not);
- a list: a test's arguments, written to the solution, its reply relayed back;
- anything else: the solution is done: kill every other process in the namespace, empty /tmp.
Its replies: {"reply": the solution's line, as text}, {"ended": why} when the solution's process
is gone (what it left is killed then), {"clean": true} or {"dirty": why} after the end.

The harness never runs a solution's code. A solution's process holds only its two pipes to the
harness; it cannot signal the harness (pid 1 of its namespace, no handlers) nor trace it (not
dumpable), and the harness reads its replies with a size limit.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys
import time

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
LINE_MAX = 1 << 17  # a longer reply is not an answer: the solution is cut off
_exit = os._exit  # held here: a solution that replaces os._exit still ends its process


class Lines:
    def __init__(self, fd: int):
        self.fd, self.buffer = fd, b""

    def next(self) -> bytes | None:
        """The next line, None at the end of the stream, b"" past LINE_MAX bytes."""
        while b"\n" not in self.buffer:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
            if len(self.buffer) > LINE_MAX:
                return b""
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def tell(obj) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def solve(request: dict, channel_in, channel_out) -> None:
    """The solution's own process: define the function, then answer each test's arguments."""
    sys.stdout = sys.stderr  # the solution's prints stay out of the replies
    namespace = {"__name__": "solution"}
    try:
        exec(compile(request["source"], "solution.py", "exec"), namespace)
        fn = namespace[request["function"]]
    except BaseException as e:
        why = f"definition: {type(e).__name__}: {e}"[:300]
        channel_out.write(json.dumps({"error": why}) + "\n")
        channel_out.flush()
        return
    channel_out.write('{"ready": true}\n')
    channel_out.flush()
    for line in channel_in:
        try:
            text = json.dumps({"value": fn(*json.loads(line))})
        except BaseException as e:
            text = json.dumps({"raised": type(e).__name__})
        channel_out.write(text + "\n")
        channel_out.flush()


def start(request: dict, cpu_s: int) -> tuple[int, int, Lines]:
    """Fork the solution's process: (pid, the pipe to it, its replies)."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(to_r, 0)
            os.dup2(from_w, 1)
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # the parent's too
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))  # counted from its fork
            solve(request, os.fdopen(0, "r"), os.fdopen(1, "w"))
        finally:
            _exit(0)
    os.close(to_r)
    os.close(from_w)
    return pid, to_w, Lines(from_r)


def fate(pid: int) -> str:
    for _ in range(50):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code >= 0:
                return f"exited with code {code}"
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:  # a real-time signal has no name
                return f"killed by signal {-code}"
        time.sleep(0.01)
    return "stopped answering"


def relay(child: tuple[int, int, Lines]) -> dict:
    pid, _, replies = child
    line = replies.next()
    if line is None:
        return {"ended": fate(pid)}
    if line == b"":
        return {"ended": "reply too large"}
    return {"reply": line.decode("utf-8", "replace")}


def kill_all() -> None:
    """Pid 1 signals every other process of its namespace (all of them the solution's), then
    reaps each, the orphans re-parented to it included."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def wipe(path: str) -> None:
    """What the solution left under `path`, whatever modes it set (it was of this uid)."""
    for entry in os.scandir(path):
        full = os.path.join(path, entry.name)
        if stat.S_ISDIR(os.lstat(full).st_mode):
            os.chmod(full, 0o700)
            wipe(full)
            os.rmdir(full)
        else:
            os.unlink(full)


def serve(cpu_s: int) -> None:
    parent, child = Lines(0), None
    while True:
        raw = parent.next()
        if not raw:
            return
        request = json.loads(raw)
        if isinstance(request, dict) and "source" in request:
            child = start(request, cpu_s)
            reply = relay(child)
        elif isinstance(request, list):
            try:
                os.write(child[1], raw + b"\n")
                reply = relay(child)
            except OSError:  # the solution closed its end
                reply = {"ended": fate(child[0])}
        else:  # nothing of this solution may reach the next one
            kill_all()
            for fd in (child[1], child[2].fd):
                os.close(fd)
            child = None
            try:
                wipe("/tmp")
                reply = {"clean": True}
            except Exception as e:
                reply = {"dirty": f"{type(e).__name__}: {e}"[:300]}
        if "ended" in reply:
            kill_all()
        tell(reply)


if __name__ == "__main__":
    libc = ctypes.CDLL(None)
    harness = os.fork()
    if harness:  # the parent kills the harness by this pid; this process reaps it and ends
        os.write(1, b'{"pid": %d}\n' % harness)
        _exit(os.waitstatus_to_exitcode(os.waitpid(harness, 0)[1]) & 0xFF)
    # pid 1 of the new pid namespace from here: when it ends or is killed, the kernel kills every
    # process in it. It dies with the process above (which dies with the caller)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace by a solution of the same uid
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python's own handler: with none, pid 1
    #                                               takes no signal from its namespace
    serve(int(sys.argv[1]))
    _exit(0)
