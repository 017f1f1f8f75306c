"""CurveZMQ keys: who may talk to the learner when it listens beyond loopback.

`make_keys(DIR)` (the `rlvr keys DIR` command) writes two keypairs as ZeroMQ's own Z85 text
certificates (`zmq.auth.create_certificates`; plain text, parsed line by line, never unpickled or
evaluated):

    DIR/learner.key          learner public key      -> every actor host
    DIR/learner.key_secret   learner secret key      -> learner host only
    DIR/actor.key            actor public key        -> learner host (the allow-list)
    DIR/actor.key_secret     actor secret key        -> every actor host

The learner (CURVE server) loads its secret and allows exactly the client public keys it finds as
`DIR/*.key` other than its own, so more actor keys can be added by dropping `NAME.key` files in.
An actor loads its own secret and the learner's public key. A learner-host folder therefore needs
`learner.key_secret` plus the actors' `*.key`; an actor-host folder needs `actor.key_secret` and
`learner.key`. Secret files are written mode 0600 in a 0700 folder.

    rlvr keys /tmp/k && python -c "from protocol.keys import *; print(load_keys('/tmp/k', 'actor'))"
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import zmq
import zmq.auth
from zmq.utils import z85

LEARNER = "learner"
ACTOR = "actor"
KEY_FILES = (f"{LEARNER}.key", f"{LEARNER}.key_secret", f"{ACTOR}.key", f"{ACTOR}.key_secret")


class KeysError(ValueError):
    """A key folder or file that is missing or unusable; the message names the file."""


@dataclass(frozen=True)
class LearnerKeys:
    public_key: bytes  # Z85, 40 bytes
    secret_key: bytes
    client_public_keys: frozenset[bytes]  # Z85 public keys of the actors allowed to connect


@dataclass(frozen=True)
class ActorKeys:
    public_key: bytes
    secret_key: bytes
    server_public_key: bytes  # the learner's


def make_keys(directory: str | os.PathLike, force: bool = False) -> list[Path]:
    """Write a learner and an actor keypair into `directory` (created if missing) and return the
    four paths. Refuses to replace existing keys unless `force`."""
    if not zmq.has("curve"):
        raise KeysError("this libzmq was built without CURVE support; cannot make keys")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    existing = [str(d / name) for name in KEY_FILES if (d / name).exists()]
    if existing and not force:
        raise KeysError(f"keys already exist: {', '.join(existing)} (use --force to replace them)")
    paths: list[Path] = []
    for name in (LEARNER, ACTOR):
        public, secret = zmq.auth.create_certificates(d, name)
        os.chmod(secret, 0o600)
        paths += [Path(public), Path(secret)]
    return paths


def load_keys(directory: str | os.PathLike,
              role: Literal["learner", "actor"]) -> LearnerKeys | ActorKeys:
    """What the endpoint playing `role` needs from the key folder (see the module docstring)."""
    d = Path(directory)
    if not d.is_dir():
        raise KeysError(f"key folder {d} does not exist (make one with `rlvr keys {d}`)")
    match role:
        case "learner":
            public, secret = _load(d / f"{LEARNER}.key_secret", need_secret=True)
            clients = frozenset(
                _load(p, need_secret=False)[0]
                for p in sorted(d.glob("*.key")) if p.name != f"{LEARNER}.key"
            )
            if not clients:
                raise KeysError(f"no actor public key (*.key other than {LEARNER}.key) in {d}: "
                                "no actor could connect")
            return LearnerKeys(public, secret, clients)
        case "actor":
            public, secret = _load(d / f"{ACTOR}.key_secret", need_secret=True)
            server, _ = _load(d / f"{LEARNER}.key", need_secret=False)
            return ActorKeys(public, secret, server)
        case _:
            raise ValueError(f"role must be 'learner' or 'actor', not {role!r}")


def _load(path: Path, need_secret: bool) -> tuple[bytes, bytes | None]:
    """(public, secret) Z85 keys from one certificate file, each checked to be a 32-byte key."""
    if not path.is_file():
        raise KeysError(f"missing key file {path} (make keys with `rlvr keys DIR`)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise KeysError(f"corrupt key file {path}: {e}") from None
    if need_secret and not secret:
        raise KeysError(f"corrupt key file {path}: no secret-key line")
    for what, key in (("public", public), ("secret", secret)):
        if key is not None and not _is_z85_key(key):
            raise KeysError(f"corrupt key file {path}: {what} key is not a 40-character Z85 key")
    return public, secret


def _is_z85_key(key: bytes) -> bool:
    if len(key) != 40:
        return False
    try:
        return len(z85.decode(key)) == 32
    except (ValueError, KeyError, struct.error):
        return False
