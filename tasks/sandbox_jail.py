"""The sandbox's confinement (tasks/sandbox.py): what its interpreter's process does between
fork and exec, as root, before it runs anything: new mount, IPC, network and pid namespaces, a
jail holding only the system's libraries and the interpreter, read-only, and an empty /tmp,
limits, and a uid of its own without privileges.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from dataclasses import dataclass

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use (rlimits of its process, and its wall time)."""

    wall_s: float = 10.0  # the whole run: start, definition, every test
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 1
    processes: int = 16  # of the run's own uid
    open_files: int = 64


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


NO_IPC = (("/proc/sys/kernel/shmmni", "0"), ("/proc/sys/kernel/msgmni", "0"),
          ("/proc/sys/kernel/sem", "0 0 0 0"), ("/proc/sys/fs/mqueue/queues_max", "0"))
"""Written in the sandbox's own IPC namespace before it drops root: no System V shared memory,
message queue or semaphore, no POSIX message queue."""
PR_SET_PDEATHSIG = 1
UIDS = (1 << 20, 1 << 21)
"""Each run takes a uid at random from here (no account needs to exist): RLIMIT_NPROC counts a
uid's processes machine-wide, so runs at once (several actors, the learner's evaluation) must
not share one, as they would sharing `nobody` (one solution's fork bomb would stop the others)."""


def confine(limits: Limits, jail: str, visible: tuple[str, ...], uid: int) -> None:
    """preexec_fn, in the child before exec: new namespaces, a jail that holds only `visible`
    (read-only) and an empty /tmp, limits, and a uid of its own without privileges."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID), "unshare")
    for path, value in NO_IPC:  # this IPC namespace's limits (a solution's segment would
        if os.path.exists(path):  # outlive it until the sandbox ends, outside its memory limit)
            with open(path, "w") as f:
                f.write(value)
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    _check(libc.mount(b"tmpfs", jail.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                      f"size={limits.file_mb * 4 + 1}m,nr_inodes=1024,mode=755".encode()),
           "tmpfs jail")  # few inodes: emptying it between solutions stays quick
    for path in visible:
        _bind_read_only(libc, path, jail)
    os.mkdir(jail + "/tmp", 0o1777)
    os.chmod(jail + "/tmp", 0o1777)
    os.chdir(jail)
    _check(libc.chroot(b"."), "chroot")
    os.chdir("/tmp")
    mb = 1024 * 1024
    # the harness serves solution after solution; each solution's process gets `cpu_s` of its own
    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
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


def visible_paths() -> tuple[str, ...]:
    """What the jail shows: the system's libraries and the interpreter's own prefix."""
    paths = [p for p in ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32")
             if os.path.lexists(p)]
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)
    return tuple(paths)
