"""ZeroMQ transport between the learner (one ROUTER) and its actors (one DEALER each).

Two endpoints, each with `send` and `recv(timeout_s)` and nothing else:

    learner = LearnerEndpoint(port=0)                    # binds 127.0.0.1, random free port
    actor = ActorEndpoint("127.0.0.1", learner.port, identity=b"actor-0")
    actor.send(Hello(...));  peer, msg = learner.recv(timeout_s=5.0);  learner.send(peer, Work(...))

Frames are one msgpack message each (`protocol.codec`). Whatever arrives is untrusted: a frame
that fails `decode` never raises out of `recv`; it is counted in `self.rejected[reason]`, logged
with the peer that sent it, and `recv` keeps waiting for the rest of its timeout. The one
exception `send` raises is `TransportError` (peer unknown to the ROUTER, or queue still full after
`send_timeout_s`), so a dead actor is noticed instead of silently dropped.

Sockets linger 0 (close never blocks on unsent data) and have a hard libzmq cap of twice
`max_bytes`, so a hostile peer cannot make us buffer an unbounded frame; frames between
`max_bytes` and the cap are refused by the codec and counted as "oversized".
Use each endpoint from one thread (ZeroMQ sockets are not thread-safe).

Exposure: by default both ends stay on loopback. Binding (or connecting) anywhere else needs
CurveZMQ keys (`rlvr keys DIR`, `protocol.keys`), passed as `curve_dir`; without them the
constructor raises `ValueError` before any socket exists. With keys, the ROUTER is a CURVE server
(traffic encrypted) and a ZAP authenticator thread on the endpoint's own context admits only the
actor public keys in the folder; a peer without CURVE, or with an unknown key, fails the
handshake, so none of its frames ever reach `recv` (refused keys are counted in
`learner.refused_keys`). `ZAP_ENFORCE_DOMAIN` makes a missing authenticator refuse, not admit.

    learner = LearnerEndpoint("0.0.0.0", 5555, curve_dir="keys/")
    actor = ActorEndpoint("learner-host", 5555, b"actor-0", curve_dir="keys/")
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import time
from errno import EACCES, EADDRINUSE

import zmq
from zmq.auth.thread import ThreadAuthenticator

from protocol.codec import MAX_BYTES, ProtocolError, decode, encode
from protocol.keys import ActorKeys, LearnerKeys, load_keys
from protocol.messages import Message

log = logging.getLogger(__name__)

_LOG_FIRST_N = 10  # per reason; after that every 1000th, so a garbage flood cannot flood the log
_ZAP_DOMAIN = "rlvr"


class TransportError(RuntimeError):
    """A send that cannot be delivered: unknown/disconnected peer, or the queue stayed full."""


class PeerGone(TransportError):
    """The peer's connection is closed: ZeroMQ has no route to it any more."""


PORT_REASONS = (EADDRINUSE, EACCES)  # a port taken, or one that needs privileges


class CannotListen(RuntimeError):
    """One of the learner's ports cannot be listened on. `errno` is the system's reason
    (EADDRINUSE: another process holds the port, EACCES: the port needs privileges, else the
    host is not this machine's); `port_key` and `host_key` are the settings that chose the port
    and the host, so `advice()` can say which one to change. The message names the address."""

    def __init__(self, message: str, errno: int, port_key: str = "net.zmq_port",
                 host_key: str = "net.bind_host"):
        super().__init__(message)
        self.errno = errno
        self.port_key = port_key
        self.host_key = host_key

    @property
    def in_use(self) -> bool:
        return self.errno == EADDRINUSE

    @property
    def port_refused(self) -> bool:
        """The port is the problem (taken, or privileged), not the host."""
        return self.errno in PORT_REASONS

    def advice(self) -> str:
        """One line for the user: the key to change, the address, the reason, what to do."""
        if self.in_use:
            return (f"{self.port_key}: {self} (another process holds it: choose another port, "
                    "or 0 for a free one)")
        if self.port_refused:
            return f"{self.port_key}: {self} (choose another port, or 0 for a free one)"
        return f"{self.host_key}: {self} (not an address of this machine)"


class _Endpoint:
    """Shared socket plumbing: one context and one socket per endpoint (no global state)."""

    def __init__(self, kind: int, max_bytes: int, vocab_size: int | None, send_timeout_s: float):
        self.max_bytes = max_bytes
        self.vocab_size = vocab_size
        self.rejected: collections.Counter[str] = collections.Counter()
        self._auth: ThreadAuthenticator | None = None
        self._ctx = zmq.Context(io_threads=1)  # its own context: one ZAP handler per context
        self._sock = self._ctx.socket(kind)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 2 * max_bytes)
        self._sock.setsockopt(zmq.SNDTIMEO, int(send_timeout_s * 1000))
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)

    def _recv_frames(self, timeout_s: float | None) -> list[bytes] | None:
        """Next multipart message within the timeout (None = wait forever), or None."""
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        if not self._poller.poll(timeout_ms):
            return None
        return self._sock.recv_multipart(zmq.NOBLOCK, copy=True)

    def _recv_loop(self, timeout_s: float | None, split) -> tuple[bytes, Message] | None:
        """Poll until one frame decodes or time runs out; `split(frames) -> (peer, payload)`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                frames = self._recv_frames(remaining)
            except zmq.Again:  # poll said readable but the message vanished; poll again
                frames = []
            if frames is None:
                return None
            if frames:
                peer, payload = split(frames)
                try:
                    if payload is None:
                        raise ProtocolError("malformed", f"{len(frames)} frames in one message")
                    return peer, decode(payload, self.max_bytes, self.vocab_size)
                except ProtocolError as e:
                    self._reject(peer, e)
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _reject(self, peer: bytes | str, err: ProtocolError) -> None:
        n = self.rejected[err.reason] = self.rejected[err.reason] + 1
        if n <= _LOG_FIRST_N or n % 1000 == 0:
            log.warning("rejected frame from %r: %s (%s; #%d)", peer, err.reason, err.detail, n)

    def close(self) -> None:
        """Close the socket (linger 0: unsent messages are dropped), the authenticator (if any)
        and the context."""
        if not self._sock.closed:
            self._poller.unregister(self._sock)
            self._sock.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
                self._auth = None
            self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LearnerEndpoint(_Endpoint):
    """ROUTER socket at the learner. Peers are the actors' identities (bytes)."""

    def __init__(
        self,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_bytes: int = MAX_BYTES,
        vocab_size: int | None = None,
        send_timeout_s: float = 10.0,
        curve_dir: str | None = None,
    ):
        _refuse_exposure("bind to", bind_host, curve_dir)
        keys = None if curve_dir is None else load_keys(curve_dir, "learner")
        super().__init__(zmq.ROUTER, max_bytes, vocab_size, send_timeout_s)
        self.refused_keys: collections.Counter[bytes] = collections.Counter()
        # Unknown peer -> EHOSTUNREACH instead of a silent drop; a restarted actor that reconnects
        # with the same identity takes its routing slot over instead of being refused.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            if keys is not None:
                self._serve_curve(keys)  # before bind: no plaintext handshake can slip in
            address = f"tcp://{bind_host}:{port or '*'}"
            try:
                self._sock.bind(address)
            except zmq.ZMQError as e:
                raise CannotListen(f"cannot listen on {address}: {zmq.strerror(e.errno)}",
                                   e.errno) from None
        except BaseException:
            self.close()
            raise
        endpoint = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.port = int(endpoint.rsplit(":", 1)[1])
        self.address = endpoint

    def _serve_curve(self, keys: LearnerKeys) -> None:
        """CURVE server with our secret key; a ZAP thread admits only the listed client keys."""
        self._auth = ThreadAuthenticator(self._ctx, log=log)
        self._auth.start()
        self._auth.configure_curve_callback(_ZAP_DOMAIN, _AllowList(keys.client_public_keys,
                                                                    self.refused_keys))
        self._sock.setsockopt_string(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
        self._sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        self._sock.setsockopt(zmq.CURVE_SERVER, 1)
        self._sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret_key)

    def send(self, peer: bytes, msg: Message) -> None:
        """Send one message to the actor whose identity is `peer`."""
        try:
            self._sock.send_multipart([peer, encode(msg)])
        except zmq.Again:
            raise TransportError(f"send to {peer!r}: queue full past send timeout") from None
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                raise PeerGone(f"send to {peer!r}: no such peer connected") from None
            raise

    def recv(self, timeout_s: float | None) -> tuple[bytes, Message] | None:
        """Next valid (peer, message) within `timeout_s` seconds, or None on timeout."""
        return self._recv_loop(timeout_s, _split_router)


class ActorEndpoint(_Endpoint):
    """DEALER socket at an actor, connected to the learner's ROUTER under `identity`."""

    def __init__(
        self,
        connect_host: str,
        port: int,
        identity: bytes,
        *,
        max_bytes: int = MAX_BYTES,
        vocab_size: int | None = None,
        send_timeout_s: float = 10.0,
        curve_dir: str | None = None,
    ):
        if not identity or len(identity) > 255 or identity[0] == 0:
            raise ValueError("identity must be 1-255 bytes and not start with a zero byte")
        _refuse_exposure("connect to", connect_host, curve_dir)
        keys = None if curve_dir is None else load_keys(curve_dir, "actor")
        super().__init__(zmq.DEALER, max_bytes, vocab_size, send_timeout_s)
        self._sock.setsockopt(zmq.IDENTITY, identity)
        if isinstance(keys, ActorKeys):
            self._sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public_key)
            self._sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public_key)
            self._sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret_key)
        self.identity = identity
        self.address = f"tcp://{connect_host}:{port}"
        self._sock.connect(self.address)

    def send(self, msg: Message) -> None:
        """Send one message to the learner (queued while the connection is being made)."""
        try:
            self._sock.send(encode(msg))
        except zmq.Again:
            raise TransportError(f"send to {self.address}: queue full past send timeout") from None

    def recv(self, timeout_s: float | None) -> Message | None:
        """Next valid message from the learner within `timeout_s` seconds, or None."""
        got = self._recv_loop(timeout_s, self._split_dealer)
        return None if got is None else got[1]

    def _split_dealer(self, frames: list[bytes]) -> tuple[str, bytes | None]:
        return self.address, frames[0] if len(frames) == 1 else None


def _split_router(frames: list[bytes]) -> tuple[bytes, bytes | None]:
    # ROUTER prepends the sender's identity; a well-behaved DEALER sends exactly one frame.
    return frames[0], frames[1] if len(frames) == 2 else None


class _AllowList:
    """ZAP credentials provider: admit exactly these Z85 client keys; count the others."""

    def __init__(self, keys: frozenset[bytes], refused: collections.Counter[bytes]):
        self.keys = keys
        self.refused = refused

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        n = self.refused[key] = self.refused[key] + 1
        if n <= _LOG_FIRST_N or n % 1000 == 0:
            log.warning("refused CURVE client key %s (not in the key folder; #%d)", key, n)
        return False


def is_loopback(host: str) -> bool:
    """127.x.x.x, ::1 and `localhost`; anything else (0.0.0.0, *, names, interfaces) is exposed."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse_exposure(verb: str, host: str, curve_dir: str | None) -> None:
    if curve_dir is None and not is_loopback(host):
        raise ValueError(
            f"refusing to {verb} {host!r} without CurveZMQ keys: only loopback (127.x.x.x, ::1, "
            f"localhost) may run unauthenticated. Run `rlvr keys DIR` and pass the key folder "
            f"(curve_dir=DIR) to both the learner and the actors."
        )
