"""The sandbox's harness (tasks/sandbox.py): the sandbox's interpreter runs this file,
`python -I -S -c <its text> CPU_S SOURCE_MAX`, already confined and without privileges (never
imported).

Its first process only reports the harness's pid to the parent and reaps it. The harness, pid 1
of the sandbox's pid namespace, reads the parent's requests, a line of JSON each:
- {"source_bytes": n, "function"} and then the n bytes of the source: fork a solution's process
  and relay its first line (ready, or why not);
- a list: a test's arguments, written to the solution, its line relayed back;
- anything else: the solution is done: kill every other process in the namespace, empty /tmp.
A solution's lines go to the parent as it wrote them, one per request; the harness's own
replies are {"ended": why} when the solution's process is gone (what it left is killed then),
and {"clean": true} or {"dirty": why} after the end.

The harness never runs a solution's code, and no Python object of it ever holds a solution's
bytes: sources and replies pass through two buffers allocated before the first solution and
zeroed after each use, so a solution forked later finds nothing of an earlier one in the memory
it inherits. A solution's process holds only its two pipes to the harness; it cannot signal the
harness (pid 1 of its namespace, no handler) nor trace it (not dumpable), and a reply longer
than LINE_MAX cuts it off.
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


class Channel:
    """Bytes read from `fd` into a buffer of its own, in place: what is read is handed on from
    the buffer and zeroed once consumed, never copied into an object that would outlive it."""

    def __init__(self, fd: int, size: int):
        self.fd, self.buffer, self.start, self.fill = fd, bytearray(size), 0, 0

    def _read(self) -> bool:
        """More bytes; False at the end of the stream or with the buffer full."""
        if self.fill == len(self.buffer):
            return False
        n = os.readv(self.fd, [memoryview(self.buffer)[self.fill:]])
        self.fill += n
        return n > 0

    def line_end(self) -> int | None:
        """Where the next line ends (its newline), None at the end of the stream or when no
        line fits the buffer."""
        while (end := self.buffer.find(b"\n", self.start, self.fill)) < 0:
            if not self._read():
                return None
        return end

    def block(self, n: int) -> int | None:
        """Where the next `n` bytes end, None if the stream ends first."""
        while self.fill - self.start < n:
            if not self._read():
                return None
        return self.start + n

    def consume(self, end: int) -> None:
        self.start = end
        if self.start == self.fill:  # nothing pending: zero what was read, start over
            self.buffer[:self.fill] = bytes(self.fill)
            self.start = self.fill = 0

    def drop(self) -> None:
        """Zero everything read, consumed or not."""
        self.buffer[:self.fill] = bytes(self.fill)
        self.start = self.fill = 0


def tell(obj) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def solve(source: str, function: str, channel_in, channel_out) -> None:
    """The solution's own process: define the function, then answer each test's arguments."""
    sys.stdout = sys.stderr  # the solution's prints stay out of the replies
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        fn = namespace[function]
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


def start(source: memoryview, function: str, cpu_s: int) -> tuple[int, int, Channel]:
    """Fork the solution's process with its source: (pid, the pipe to it, its replies)."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(to_r, 0)
            os.dup2(from_w, 1)
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # the parent's too
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))  # counted from its fork
            solve(str(source, "utf-8", "replace"), function, os.fdopen(0, "r"),
                  os.fdopen(1, "w"))
        finally:
            _exit(0)
    os.close(to_r)
    os.close(from_w)
    return pid, to_w, Channel(from_r, LINE_MAX + 65536)


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


def relay(child: tuple[int, int, Channel]) -> dict | None:
    """The solution's next line, written to the parent from the buffer as it came (None), or
    the harness's reply when there is none."""
    pid, _, replies = child
    end = replies.line_end()
    if end is None:
        too_large = replies.fill == len(replies.buffer)
        replies.drop()
        return {"ended": "reply too large" if too_large else fate(pid)}
    with memoryview(replies.buffer) as buffer:
        at = replies.start
        while at <= end:
            at += os.write(1, buffer[at:end + 1])
    replies.drop()  # one line a request: what it wrote ahead is not relayed
    return None


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


def serve(cpu_s: int, source_max: int) -> None:
    parent, child = Channel(0, source_max + 65536), None  # a source and its header
    while True:
        end = parent.line_end()
        if end is None:
            return
        request = json.loads(bytes(parent.buffer[parent.start:end]))  # the parent's own words
        parent.consume(end + 1)
        if isinstance(request, dict) and "source_bytes" in request:
            end = parent.block(request["source_bytes"])
            if end is None:
                return
            with memoryview(parent.buffer) as buffer:
                child = start(buffer[parent.start:end], request["function"], cpu_s)
            parent.consume(end)  # zeroed: the next solution is forked without it
            reply = relay(child)
        elif isinstance(request, list):
            try:
                os.write(child[1], json.dumps(request).encode() + b"\n")
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
        if reply is not None:
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
    serve(int(sys.argv[1]), int(sys.argv[2]))
    _exit(0)
