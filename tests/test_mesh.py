"""The worker's TCP mesh on loopback: paced messages keep going out while a call waits."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

from hosts.engine import _Call
from hosts.mesh import MESSAGE, Kind, Peer


def connected_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    near = socket.create_connection(listener.getsockname())
    far, _ = listener.accept()
    near.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    near.setblocking(False)
    return near, far


def test_a_paced_message_to_another_level_goes_on_while_the_call_waits_on_this_one():
    """The exponent exchange waits on one level at a time; a message to the level before
    that is larger than its connection's pacing limit must still go out in full (its tail
    stayed in the outbox, and the neighbours of that level waited for it until timeout)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        (this_near, this_far), (before_near, before_far) = (connected_pair(listener),
                                                            connected_pair(listener))
        this_level = Peer(1, 1, this_near, limit=9000)
        level_before = Peer(2, 0, before_near, limit=9000)
        payload = bytes(range(256)) * 160  # 40 KB: five times the limit
        level_before.send(Kind.EXPONENTS, 7, 0, 0, 0, len(payload), payload)
        assert level_before.outbox, "the limit should have held part of the message back"
        call = SimpleNamespace(engine=SimpleNamespace(
            mesh=SimpleNamespace(all=lambda: [this_level, level_before]), job=1, home=0,
            timeout=10.0))
        received = bytearray()
        before_far.settimeout(0.05)
        deadline = time.monotonic() + 10
        while len(received) < MESSAGE.size + len(payload) and time.monotonic() < deadline:
            _Call._wait(call, [this_level], deadline, "a test", [1])
            try:
                received += before_far.recv(1 << 16)
            except TimeoutError:
                pass
        assert bytes(received[MESSAGE.size:]) == payload
        assert not level_before.outbox
        for sock in (this_near, this_far, before_near, before_far):
            sock.close()
