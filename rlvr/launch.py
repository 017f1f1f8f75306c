"""Local launcher behind `rlvr train`: resolve the config, then start the learner and actors.

Everything that can be wrong with a config is found here, before any process starts. The
resolved config (the warm-started model path and free ports filled in) is written to the run
folder; the processes read only that file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from learner.progress import CONSOLE_FD_ENV
from protocol.exit_codes import REQUEUE_EXIT_CODE
from protocol.config import Config, ConfigError, load_config, write_resolved
from protocol.config.checks import config_warnings
from rlvr.data_check import preflight


SPAWNER_ENV = "RLVR_SPAWNER"
"""Names a module whose `spawn(argv, log_path, env, pass_fds, console_env)` starts the run's
processes instead of `python -m` (the test suite's preloaded fork server, tests/forkserver.py)."""


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


PORT_LEASE_S = 600.0  # longer than a loaded machine takes from launch to the learner's listen


def port_leases() -> Path:
    return Path(tempfile.gettempdir()) / f"rlvr-port-leases-{os.getuid()}"


def lease(port: int, now: float | None = None) -> bool:
    """Claim `port` on this machine for PORT_LEASE_S; False if another choice holds it. A bind
    check sees only ports already listened on: a CI run's learner could not listen on its ZeroMQ
    port (EADDRINUSE) because, between the launcher's choice and the learner's listen, the port
    was chosen and taken by a run beside it (or by the same run's second free_port). The leases
    are one file, rewritten under an exclusive lock; expired and unreadable lines are dropped."""
    now = time.time() if now is None else now
    with open(port_leases(), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        f.seek(0)
        held = {}
        for line in f.read().splitlines():
            try:
                p, until = line.split()
                held[int(p)] = float(until)
            except ValueError:
                continue  # a line cut short: the lease it named is lost, not the file
        held = {p: until for p, until in held.items() if until > now}
        if port in held:
            return False
        held[port] = now + PORT_LEASE_S
        f.seek(0)
        f.truncate()
        f.write("".join(f"{p} {until}\n" for p, until in held.items()))
        return True


def free_port() -> int:
    """A free port below the ephemeral range, leased (see `lease`) so that no other free_port
    on this machine returns it for PORT_LEASE_S. A port the kernel hands out (bind to 0) can be
    taken, between this choice and the learner's listen, as the local end of an outgoing
    connection: a CI run lost its weight store that way (EADDRINUSE) once the actor had
    connected over ZeroMQ. Outgoing connections never take ports outside the ephemeral range."""
    lo, _ = ephemeral_ports()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(lo, 10_001))
        if not lease(port):
            continue  # chosen lately by another launch: it may not be listening yet
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # a listener has it: try another
            return port
    with socket.socket() as s:  # every try was taken: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve(cfg: Config, log=print) -> Config:
    """Fill in what the run decides at launch: the model path and any port left at 0."""
    if not cfg.model.path:
        if cfg.task.kind != "arithmetic" and cfg.warm_start.source != "task":
            raise ConfigError("model.path is required unless task.kind is 'arithmetic' (the "
                              "embedded tiny model is warm-started on that task) or "
                              "warm_start.source is 'task' (on the file task's solutions)")
        from rlvr.warm_start import ensure_warm_start

        cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, path=str(ensure_warm_start(cfg, log))))
    net = cfg.net
    ports = {k: getattr(net, k) or free_port() for k in ("zmq_port", "weights_port", "master_port")}
    return dataclasses.replace(cfg, net=dataclasses.replace(net, **ports))


def run_dir_for(cfg: Config, resume: bool) -> Path:
    run_dir = cfg.run_dir
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"run folder {run_dir} already holds a run: resume it with "
                          f"`rlvr train --resume {run_dir}`, or choose another run.name")
    return run_dir


def spawn(args: list[str], log_path: Path | None, env: dict | None = None,
          console: bool = False) -> subprocess.Popen:
    """`python -m ARGS` with its stdout and stderr appended to `log_path` (None: this terminal).
    `console`: the process also gets this process's stderr as a descriptor of its own, named by
    CONSOLE_FD_ENV, for the lines it means for the user (learner/main.py): what libraries print
    (progress bars, warnings, C-level output) stays in the log file."""
    out = open(log_path, "ab") if log_path else None
    fds = (os.dup(sys.stderr.fileno()),) if console and out else ()
    named = {CONSOLE_FD_ENV: str(fds[0])} if fds else {}
    spawner = os.environ.get(SPAWNER_ENV)
    try:
        if spawner and out:  # see SPAWNER_ENV
            return importlib.import_module(spawner).spawn(
                args, log_path, {**os.environ, **(env or {})}, fds,
                CONSOLE_FD_ENV if fds else None)
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out,
                                stderr=subprocess.STDOUT if out else None,
                                env={**os.environ, **(env or {}), **named}, pass_fds=fds)
    finally:  # the child holds its own copies
        for fd in fds:
            os.close(fd)
        if out:
            out.close()


def rank_env(cfg: Config, rank: int) -> dict[str, str]:
    """torch.distributed's env:// rendezvous for learner rank `rank` on this machine."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(cfg.net.master_port),
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(cfg.learner.ranks),
            "LOCAL_WORLD_SIZE": str(cfg.learner.ranks)}


def launch(cfg: Config, run_dir: Path, resume: bool = False) -> int:
    """Start learner + actors on this machine; returns the learner's exit code. A crashed
    actor is started again (the learner hands its prompts to the others meanwhile), up to
    `actors.max_restarts` times in all; after that the run stops."""
    write_resolved(cfg, run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    learner_args = ["learner.main", "--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    learner = spawn(learner_args, run_dir / "logs" / "learner.log", rank_env(cfg, 0), console=True)
    # data-parallel ranks 1..R-1 follow rank 0 and end when it tells them to (or are stopped)
    followers = [spawn(learner_args, run_dir / "logs" / f"learner-{r}.log", rank_env(cfg, r))
                 for r in range(1, cfg.learner.ranks)]

    def start_actor(i: int) -> subprocess.Popen:
        return spawn(["actors.main", "--run-dir", str(run_dir), "--actor-id", str(i)],
                     run_dir / "logs" / f"actor-{i}.log")

    actors = [start_actor(i) for i in range(cfg.actors.count)]
    restarts = 0
    # `kill`, `timeout`, a container's stop: SIGTERM takes the Ctrl-C path below, which stops the
    # learner and then every actor (by default it ended this process alone, and the learner, the
    # actors and their verifiers ran on without it)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while learner.poll() is None:
            if any(f.poll() not in (None, 0) for f in followers):  # rank 0 would wait forever
                print(f"a learner rank exited early (see {run_dir}/logs/learner-*.log); stopping "
                      f"the run (resume it with `rlvr train --resume {run_dir}`)", file=sys.stderr)
                learner.terminate()
                learner.wait(30)
                break
            restarts = _restart_crashed(actors, start_actor, restarts, cfg, run_dir)
            if restarts is None:  # out of restarts: the run stops
                learner.send_signal(signal.SIGTERM)
                learner.wait(30)
                break
            try:
                learner.wait(0.5)  # returns the moment the learner exits
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        learner.send_signal(signal.SIGINT)
        learner.wait(30)
    finally:
        # after a clean finish the actors have been told to shut down; otherwise nobody will
        grace_s = 20.0 if learner.poll() == 0 else 2.0
        stop_all(followers + actors, grace_s=grace_s)
        if learner.poll() is None:  # it did not stop within its 30 s
            stop_all([learner], grace_s=0.0)
        signal.signal(signal.SIGTERM, previous)
    code = learner.wait()
    if code not in (0, REQUEUE_EXIT_CODE):
        _show_tail(run_dir / "logs" / "learner.log", f"the learner exited with code {code}")
    return code


def _restart_crashed(actors: list, start_actor, restarts: int, cfg: Config, run_dir: Path
                     ) -> int | None:
    """Start every actor that crashed again (in place in `actors`); the restarts used so far,
    or None once one more would pass `actors.max_restarts`."""
    for i, actor in enumerate(actors):
        code = actor.poll()
        if code in (None, 0):  # 0: told to shut down, the learner is finishing
            continue
        log_hint = f"see {run_dir}/logs/actor-{i}.log"
        if restarts >= cfg.actors.max_restarts:
            print(f"actor {i} exited with code {code} ({log_hint}); "
                  f"{restarts} restarts used of actors.max_restarts={cfg.actors.max_restarts}: "
                  "stopping the run", file=sys.stderr)
            return None
        restarts += 1
        print(f"actor {i} exited with code {code} ({log_hint}); restarting it "
              f"({restarts}/{cfg.actors.max_restarts})", file=sys.stderr, flush=True)
        actors[i] = start_actor(i)
    return restarts


def _show_tail(log: Path, why: str, lines: int = 40) -> None:
    """The end of a log whose process failed, on stderr: its traceback went to the file."""
    tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
    print(f"{why}; the last {len(tail)} lines of {log}:", *tail, sep="\n", file=sys.stderr,
          flush=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def stop_all(procs: list[subprocess.Popen], grace_s: float = 20.0) -> None:
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def train(config_path: str | None, overrides: list[str], resume_dir: str | None,
          dry_run: bool) -> int:
    if resume_dir:
        run_dir = Path(resume_dir)
        if not (run_dir / "config.yaml").exists():
            raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a run folder)")
        # the ports of the first launch may be taken by now: pick fresh ones unless overridden
        cfg = load_config(run_dir / "config.yaml",
                          ["net.zmq_port=0", "net.weights_port=0", "net.master_port=0", *overrides],
                          run_folder=True)
    else:
        cfg = load_config(config_path, overrides)
        run_dir = cfg.run_dir if dry_run else run_dir_for(cfg, resume=False)
    if dry_run:
        from protocol.config.loader import to_dict
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    for warning in config_warnings(cfg):  # the learner's log says it again
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    preflight(cfg)  # bad rows and model folders stop the run here, before any process starts
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = resolve(cfg, log=lambda line: print(line, flush=True))
    return launch(cfg, run_dir, resume=bool(resume_dir))
