"""The ports a run listens on are ones no outgoing connection can take in the meantime."""

import socket
import subprocess
import sys
import tempfile

from rlvr.launch import PORT_LEASE_S, ephemeral_ports, free_port, lease, port_leases


def test_a_chosen_port_lies_outside_the_range_outgoing_connections_draw_from():
    # a CI run's learner could not listen on its weight store's port (EADDRINUSE): the kernel had
    # handed the same ephemeral port to an outgoing connection after the launcher chose it
    lo, hi = ephemeral_ports()
    for _ in range(50):
        port = free_port()
        assert not lo <= port <= hi, (port, lo, hi)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # and it is free


def test_a_taken_port_is_never_chosen():
    taken = []
    try:
        for port in range(10_000, 10_050):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
            except OSError:
                s.close()
                continue
            taken.append(s)
        held = {s.getsockname()[1] for s in taken}
        assert all(free_port() not in held for _ in range(200))
    finally:
        for s in taken:
            s.close()


def test_two_launches_on_one_machine_never_choose_the_same_port():
    # a CI run's learner could not listen on its ZeroMQ port: a run beside it had chosen the
    # same one after the launcher did. 300 + 300 unleased draws from ~22,700 ports repeat one
    # about 8 times on average.
    other = subprocess.run(
        [sys.executable, "-c", "from rlvr.launch import free_port\n"
                               "print(*(free_port() for _ in range(300)))"],
        capture_output=True, text=True, check=True, timeout=60)
    theirs = [int(p) for p in other.stdout.split()]
    ours = [free_port() for _ in range(300)]
    assert len(set(theirs)) == len(theirs) and len(set(ours)) == len(ours)
    assert not set(ours) & set(theirs)


def test_a_lease_expires_and_a_cut_line_loses_only_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert lease(20_000, now=0.0) and not lease(20_000, now=PORT_LEASE_S - 1)
    with open(port_leases(), "a") as f:
        f.write("21000 ")  # a write cut short
    assert lease(20_001, now=1.0) and not lease(20_001, now=2.0)
    assert lease(21_000, now=2.0)  # the cut line held nothing
    assert lease(20_000, now=PORT_LEASE_S + 1)
