"""The ports a run listens on are ones no outgoing connection can take in the meantime."""

import socket

from rlvr.launch import ephemeral_ports, free_port


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
