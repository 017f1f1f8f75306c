"""The test suite's fork server: a run's learner and actors start from a preloaded interpreter.

Why: a learner or actor started as `python -m` spends about 9 CPU-seconds importing torch,
transformers' Qwen2 and DeepSpeed before its first line, and the suite starts over a hundred of
them. `serve` imports those once, then forks one child per request; the child takes the
request's argv, environment, working directory and log file and runs the module as `__main__`,
as `python -m` would. rlvr/launch.py's `spawn` hands its processes here when RLVR_SPAWNER names
this module (tests/conftest.py `run_rlvr` sets it); `spawn` below returns a `Forked`, which
answers the launcher's `poll`, `wait`, `send_signal`, `terminate` and `kill` like a Popen.

What a child does not get from a fresh interpreter: environment variables read while the
server imported its libraries keep the server's values (none of rlvr's own are read at import),
and its processes are not in the launcher's process group (test_faults_wire.py, which kills the
group, starts its runs without the server). SLURM jobs never use it: their environment does not
name it (tests/test_slurm_cluster.py).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import random
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from rlvr.launch import SPAWNER_ENV

SOCKET_ENV = "RLVR_FORKSERVER_SOCKET"
PRELOAD = ("torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "deepspeed",
           "zmq", "learner.main", "actors.main")


def serve(path: str) -> None:
    """Preload PRELOAD, then fork a child per request on the unix socket `path` until the
    server is killed. Each request's connection stays open: the server writes the child's
    exit code on it when the child ends."""
    for name in PRELOAD:
        importlib.import_module(name)
    # a fork copies only the forking thread: a library thread would be missing in every child
    assert threading.active_count() == 1, threading.enumerate()
    base_path = [p for p in sys.path if p not in ("", os.getcwd())]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    print("ready", flush=True)
    parent = os.getppid()
    while True:
        if os.getppid() != parent:  # the test process died without stopping us: nor will it
            os.killpg(0, signal.SIGKILL)  # our group: this server and the runs it forked
        if select.select([listener], [], [], 0.05)[0]:
            conn, _ = listener.accept()
            try:
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
                request = json.loads(message)
            except (OSError, ValueError) as e:  # a launcher gone before it asked: serve on
                print(f"forkserver: a request could not be read: {e}", file=sys.stderr)
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in waiting.values():
                    other.close()
                conn.close()
                _run_child(request, fds, base_path)  # does not return
            for fd in fds:
                os.close(fd)
            try:
                conn.send(json.dumps({"pid": pid}).encode())
            except OSError:
                pass  # the launcher is gone: the child runs on, reaped below, as an orphan would
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)})
                              .encode())
                except OSError:
                    pass  # the launcher is gone
                conn.close()


def _run_child(request: dict, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: become `python -m MODULE ARGS` in the request's world, then exit
    as the interpreter would (threads joined, atexit handlers run)."""
    code = 1
    try:
        log_fd, *console = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        env = request["env"]
        if console and request["console_env"]:
            env[request["console_env"]] = str(console[0])
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *base_path]
        random.seed()  # a fresh interpreter's global generators are seeded from the OS
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        module, *args = request["argv"]
        sys.argv = [module, *args]
        sys.modules.pop(module, None)  # preloaded: run afresh as __main__, as `python -m` does
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except KeyboardInterrupt:
            traceback.print_exc()
            code = -signal.SIGINT
        threading._shutdown()  # what the interpreter does at exit: join non-daemon threads
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code < 0:  # died of a signal, as a fresh interpreter interrupted by Ctrl-C does
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Forked:
    """A child of the fork server, seen from the launcher as a subprocess.Popen."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str]):
        self.conn, self.pid, self.args = conn, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read()
        return self.returncode

    def _read(self) -> None:
        message = self.conn.recv(4096)
        # an empty read: the server died, and its children were orphaned with it
        self.returncode = json.loads(message)["returncode"] if message else -signal.SIGKILL
        self.conn.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(argv: list[str], log_path: Path, env: dict, pass_fds: tuple[int, ...],
          console_env: str | None) -> Forked:
    """Start `python -m ARGV` through the server at $RLVR_FORKSERVER_SOCKET, its stdout and
    stderr appended to `log_path`; `pass_fds` (at most one) is the console descriptor whose
    number the child finds in `console_env`."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(env[SOCKET_ENV])
    with open(log_path, "ab") as log:
        request = {"argv": argv, "env": env, "cwd": os.getcwd(), "console_env": console_env}
        socket.send_fds(conn, [json.dumps(request).encode()], [log.fileno(), *pass_fds])
    return Forked(conn, json.loads(conn.recv(4096))["pid"], argv)


class Server:
    """One fork server for this test process, started on first use and stopped at exit."""

    def __init__(self, folder: Path):
        self.path = folder / "forkserver.sock"
        self.log = folder / "forkserver.log"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        """The environment entries that make `rlvr train` start its processes here."""
        if self.proc is None:
            self.path.unlink(missing_ok=True)
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.forkserver", str(self.path)],
                    cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, stderr=log,
                    start_new_session=True)  # a group of its own, its children's too
            for line in self.proc.stdout:  # what the libraries print while imported, then
                if line.strip() == b"ready":
                    break
            else:
                raise RuntimeError(f"the fork server did not start: see {self.log}")
            atexit.register(self.stop)
        return {SPAWNER_ENV: __name__, SOCKET_ENV: str(self.path)}

    def stop(self) -> None:
        """The server and what a failed test left running of its children."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


if __name__ == "__main__":
    serve(sys.argv[1])
