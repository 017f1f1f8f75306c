"""Exposure (protocol/keys.py, protocol/transport.py, `rlvr keys`) over real tcp sockets: a learner
bound beyond loopback needs CurveZMQ keys; an actor with the actor key talks to it from another
process, while a peer without CURVE or with an unknown key gets nothing through."""

import multiprocessing as mp
import os
import re
import shutil
import stat
import threading

import pytest
import zmq
from zmq.auth.thread import AuthenticationThread
from zmq.utils.monitor import recv_monitor_message

from rlvr.cli import main as rlvr
from protocol.codec import encode
from protocol.keys import KEY_FILES, ActorKeys, KeysError, LearnerKeys, load_keys, make_keys
from protocol.messages import PROTOCOL_VERSION, Hello, RolloutSpec, Shutdown, Work
from protocol.transport import ActorEndpoint, CannotListen, LearnerEndpoint, is_loopback

V = PROTOCOL_VERSION


def hello(actor_id: int = 0) -> Hello:
    return Hello(protocol_version=V, policy_version=0, actor_id=actor_id, host="localhost", pid=1)


def work() -> Work:
    return Work(protocol_version=V, policy_version=1, work_id="w-1", prompts=[],
                rollout=RolloutSpec(strategy="fixed", max_new_tokens=8))


def keyed_actor_process(port: int, curve_dir: str) -> None:
    """Child process: an actor with the actor key says hello, echoes the Work, ends on Shutdown."""
    with ActorEndpoint("127.0.0.1", port, identity=b"actor-0", curve_dir=curve_dir) as actor:
        actor.send(hello())
        w = actor.recv(timeout_s=20.0)
        assert w == work(), w
        actor.send(w)  # any protocol message will do as the reply
        assert isinstance(actor.recv(timeout_s=20.0), Shutdown)


def intruder_process(port: int, curve_dir: str | None, seconds: float) -> None:
    """Child process: a raw DEALER (no CURVE, or CURVE with the keys in `curve_dir`) that keeps
    sending hellos. Exits 0 if its handshake failed and nothing ever came back, 1 otherwise."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    monitor = sock.get_monitor_socket()
    if curve_dir is not None:
        keys = load_keys(curve_dir, "actor")
        sock.curve_serverkey = keys.server_public_key
        sock.curve_publickey = keys.public_key
        sock.curve_secretkey = keys.secret_key
    sock.connect(f"tcp://127.0.0.1:{port}")
    failed = {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH,
              zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}
    refused = got_reply = False
    for _ in range(int(seconds / 0.1)):
        try:  # the failed handshake can drop the pipe between a poll and the send
            sock.send(encode(hello(9)), zmq.NOBLOCK)
        except zmq.Again:
            pass
        got_reply |= bool(sock.poll(50))
        while monitor.poll(50):
            refused |= recv_monitor_message(monitor)["event"] in failed
    sock.disable_monitor()
    monitor.close()
    sock.close()
    ctx.term()
    raise SystemExit(0 if refused and not got_reply else 1)


def spawn(target, *args) -> mp.Process:
    child = mp.get_context("spawn").Process(target=target, args=args)
    child.start()
    return child


def finish(child: mp.Process) -> int:
    child.join(timeout=20.0)
    if child.is_alive():
        child.kill()
        child.join()
    return child.exitcode


@pytest.fixture
def keys(tmp_path) -> str:
    make_keys(tmp_path / "keys")
    return str(tmp_path / "keys")


@pytest.fixture
def curve_learner(keys):
    # 0.0.0.0 is beyond loopback: allowed only because it has keys; actors reach it on 127.0.0.1
    with LearnerEndpoint("0.0.0.0", 0, max_bytes=4096, curve_dir=keys) as endpoint:
        yield endpoint


def test_an_actor_with_the_actor_key_exchanges_hello_and_work_with_a_curve_learner(
    curve_learner, keys
):
    child = spawn(keyed_actor_process, curve_learner.port, keys)
    try:
        assert curve_learner.recv(timeout_s=20.0) == (b"actor-0", hello())
        curve_learner.send(b"actor-0", work())
        assert curve_learner.recv(timeout_s=20.0) == (b"actor-0", work())
        curve_learner.send(b"actor-0", Shutdown(protocol_version=V, policy_version=1))
    finally:
        assert finish(child) == 0
    assert not curve_learner.rejected and not curve_learner.refused_keys


def test_a_peer_without_curve_gets_nothing_through(curve_learner):
    child = spawn(intruder_process, curve_learner.port, None, 1.5)
    try:
        assert curve_learner.recv(timeout_s=2.0) is None
    finally:
        assert finish(child) == 0  # it saw its handshake fail and got no reply
    assert not curve_learner.rejected  # refused at the handshake: no frame reached the codec


def test_a_peer_with_an_unknown_client_key_is_refused(curve_learner, keys, tmp_path):
    # the intruder knows the learner's public key (it is public) but holds a key of its own
    other = tmp_path / "other"
    make_keys(other)
    shutil.copy(os.path.join(keys, "learner.key"), other / "learner.key")
    child = spawn(intruder_process, curve_learner.port, str(other), 1.5)
    try:
        assert curve_learner.recv(timeout_s=2.0) is None
    finally:
        assert finish(child) == 0
    assert list(curve_learner.refused_keys) == [load_keys(other, "actor").public_key]
    assert not curve_learner.rejected


def test_an_actor_refuses_a_learner_whose_key_it_does_not_hold(curve_learner, tmp_path):
    other = tmp_path / "other"
    make_keys(other)  # a whole different key set: wrong learner key, unknown actor key
    with ActorEndpoint("127.0.0.1", curve_learner.port, b"actor-1", curve_dir=str(other)) as a:
        a.send(hello(1))
        assert curve_learner.recv(timeout_s=1.0) is None


def test_two_curve_learners_in_one_process_each_keep_their_own_authenticator(keys, tmp_path):
    make_keys(tmp_path / "second")
    second = str(tmp_path / "second")
    with LearnerEndpoint(curve_dir=keys) as one, LearnerEndpoint(curve_dir=second) as two:
        with ActorEndpoint("127.0.0.1", one.port, b"a1", curve_dir=keys) as a1, \
                ActorEndpoint("127.0.0.1", two.port, b"a2", curve_dir=second) as a2:
            a1.send(hello(1))
            a2.send(hello(2))
            assert one.recv(timeout_s=10.0) == (b"a1", hello(1))
            assert two.recv(timeout_s=10.0) == (b"a2", hello(2))
        with ActorEndpoint("127.0.0.1", two.port, b"a3", curve_dir=keys) as crossed:
            crossed.send(hello(3))  # keys of the first learner are not good for the second
            assert two.recv(timeout_s=1.0) is None


def test_close_stops_the_authenticator_thread(keys):
    def auth_threads() -> int:
        return sum(isinstance(t, AuthenticationThread) for t in threading.enumerate())

    before = auth_threads()
    learner = LearnerEndpoint(curve_dir=keys)
    assert auth_threads() == before + 1
    learner.close()
    assert auth_threads() == before


@pytest.mark.parametrize("host", ["0.0.0.0", "*", "10.1.2.3", "eth0", "learner-node", "::"])
def test_binding_beyond_loopback_without_keys_raises_naming_the_address(host):
    with pytest.raises(ValueError, match=re.escape(repr(host)) + ".*Run `rlvr keys DIR`"):
        LearnerEndpoint(host, 0)


def test_connecting_beyond_loopback_without_keys_raises_too():
    with pytest.raises(ValueError, match="'10.1.2.3'.*rlvr keys"):
        ActorEndpoint("10.1.2.3", 5555, identity=b"actor-0")


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("*", False), ("192.168.1.5", False),
    ("example.org", False), ("", False),
])
def test_only_127_x_and_ipv6_loopback_and_localhost_count_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_load_keys_gives_each_side_what_its_endpoint_needs(keys):
    learner, actor = load_keys(keys, "learner"), load_keys(keys, "actor")
    assert isinstance(learner, LearnerKeys) and isinstance(actor, ActorKeys)
    assert actor.server_public_key == learner.public_key
    assert learner.client_public_keys == {actor.public_key}
    assert all(len(k) == 40 for k in (learner.secret_key, actor.secret_key))


def test_a_missing_key_file_is_named(keys, tmp_path):
    os.remove(os.path.join(keys, "learner.key"))
    with pytest.raises(KeysError, match="missing key file .*learner.key"):
        ActorEndpoint("127.0.0.1", 5555, identity=b"actor-0", curve_dir=keys)
    with pytest.raises(KeysError, match="missing key file .*learner.key_secret"):
        load_keys(tmp_path, "learner")
    os.remove(os.path.join(keys, "actor.key"))
    with pytest.raises(KeysError, match="no actor public key"):
        load_keys(keys, "learner")


def test_a_corrupt_key_file_is_named_and_never_evaluated(keys):
    secret = os.path.join(keys, "learner.key_secret")
    with open(secret, "w") as f:
        f.write('curve\n    public-key = "__import__(\'os\').system(\'false\')"\n'
                '    secret-key = "short"\n')
    with pytest.raises(KeysError, match="corrupt key file .*learner.key_secret"):
        LearnerEndpoint(curve_dir=keys)
    with pytest.raises(KeysError, match="key folder .*nowhere does not exist"):
        LearnerEndpoint(curve_dir=os.path.join(keys, "nowhere"))


def test_rlvr_keys_writes_four_certificates_and_refuses_to_overwrite(tmp_path, capsys):
    d = tmp_path / "k"
    assert rlvr(["keys", str(d)]) == 0
    out = capsys.readouterr().out
    assert all(str(d / name) in out for name in KEY_FILES) and "actor hosts" in out
    assert stat.S_IMODE(os.stat(d / "actor.key_secret").st_mode) == 0o600
    before = (d / "learner.key_secret").read_text()

    assert rlvr(["keys", str(d)]) == 1
    err = capsys.readouterr().err
    assert "already exist" in err and "--force" in err
    assert (d / "learner.key_secret").read_text() == before

    assert rlvr(["keys", str(d), "--force"]) == 0
    assert (d / "learner.key_secret").read_text() != before


def test_a_host_that_is_not_this_machines_is_refused_naming_net_bind_host(keys):
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): documentation only, never a machine's own address
    with pytest.raises(CannotListen) as refused:
        LearnerEndpoint("192.0.2.1", 0, curve_dir=keys)
    assert not refused.value.port_refused
    assert refused.value.advice() == ("net.bind_host: cannot listen on tcp://192.0.2.1:*: Cannot "
                                      "assign requested address (not an address of this machine)")
