"""The worker's TCP mesh on loopback: paced messages keep going out while a call waits; the
greeting makes two neighbours' detours agree, whichever end planned one first."""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib

import numpy as np

from bml.protocol import DEFAULT_WIRE
from bml.schedule import HOST_BASED, make_schedule
from bml.topology import Topology
from hosts.call import Call
from hosts.engine import Engine
from hosts.membership import Membership
from hosts.mesh import (
    MESSAGE,
    Kind,
    Mesh,
    MeshError,
    Peer,
    abort_reason,
    decode_message,
    encode_message,
)
from hosts.recovery import NicState


def connected_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    near = socket.create_connection(listener.getsockname())
    far, _ = listener.accept()
    near.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    near.setblocking(False)
    return near, far


def read_message(sock: socket.socket, deadline: float) -> bytes:
    """The first message that arrives on ``sock`` (what follows it is read and dropped)."""
    data = bytearray()
    sock.settimeout(0.05)
    while time.monotonic() < deadline:
        if len(data) >= MESSAGE.size and len(data) >= MESSAGE.size + MESSAGE.unpack_from(data)[6]:
            return bytes(data[:MESSAGE.size + MESSAGE.unpack_from(data)[6]])
        try:
            data += sock.recv(1 << 16)
        except TimeoutError:
            pass
    return bytes(data)


def test_a_paced_message_to_another_level_goes_on_while_the_call_waits_on_this_one():
    """The exponent exchange waits on one level at a time; a message to the level before
    that is larger than its connection's pacing limit must still go out in full while the
    call waits on the next (its tail stayed in the outbox once, and the neighbours of that
    level waited for it until their timeout)."""
    topology = Topology.parse("bcube:2,2")
    plan = Membership.of(1, 0, topology, make_schedule(topology, HOST_BASED))
    floats = 64 * 40_000  # 40,000 block exponents, spread so that zlib keeps over 9 KB
    rng = np.random.default_rng(0)
    gradient = (rng.standard_normal(floats) * 2.0 ** rng.integers(-60, 60, floats)).astype(
        np.float32)
    call = Call(plan, [NicState(0, "10.0.0.1"), NicState(1, "10.0.1.1")],
                gradient, 7, 0, time.monotonic(), 64, 0.4, 0.4,
                DEFAULT_WIRE)  # timeouts under SWITCH_SILENCE: no NIC here to ask a switch
    with socket.create_server(("127.0.0.1", 0)) as listener:
        (level0_near, level0_far), (level1_near, level1_far) = (connected_pair(listener),
                                                                connected_pair(listener))
        (dim0, peer0), (dim1, peer1) = plan.neighbours(0)[0], plan.neighbours(1)[0]
        engine = object.__new__(Engine)  # the loop alone: no NIC sockets, this mesh
        engine.plan, engine.links = plan, []
        engine.mesh = type("LoopbackMesh", (), {})()
        engine.mesh.peers = {(dim0, peer0): Peer(peer0, 0, level0_near, limit=9000),
                             (dim1, peer1): Peer(peer1, 1, level1_near, limit=9000)}
        # The level-0 neighbour answers at once, so the call moves on to wait on level 1
        # while its own level-0 message is still held back by the pacing limit.
        head = json.dumps({"lengths": [floats, floats], "codes": [plan.base_code],
                           "generation": 1}).encode()
        exponents = zlib.compress(np.full(floats // 64, 128, dtype=np.uint8).tobytes())
        level0_far.sendall(encode_message(Kind.EXPONENTS, 7, 0, 0, len(head),
                                          len(exponents), head + exponents))
        engine._drive(call)  # ends with the exchange's timeout on level 1
        deadline = time.monotonic() + 10
        received = read_message(level0_far, deadline)
        sent_head = MESSAGE.unpack_from(received)
        assert sent_head[0] == Kind.EXPONENTS and sent_head[6] == len(received) - MESSAGE.size
        assert len(received) > 9000  # it was paced: larger than the limit
        assert call.exchange_dim == 1  # it did wait on level 1
        assert not engine.mesh.peers[(dim0, peer0)].outbox
        assert "level 1" in str(call.error)
        for sock in (level0_near, level0_far, level1_near, level1_far):
            sock.close()


def test_exponents_that_do_not_inflate_end_the_call_naming_the_sender():
    """The exponent exchange's body is zlib-compressed; a body that does not inflate to the
    announced blocks (another version, a forged message) is refused, naming the sender,
    instead of merging garbage into the exponents every sum is quantised with."""
    topology = Topology.parse("bcube:2,2")
    plan = Membership.of(1, 0, topology, make_schedule(topology, HOST_BASED))
    floats = 64 * 100
    call = Call(plan, [NicState(0, "10.0.0.1"), NicState(1, "10.0.1.1")],
                np.ones(floats, dtype=np.float32), 7, 0, time.monotonic(), 64, 0.4, 0.4,
                DEFAULT_WIRE)
    head = json.dumps({"lengths": [floats, floats], "codes": [plan.base_code],
                       "generation": 1}).encode()
    key = plan.neighbours(0)[0]
    call.on_message(time.monotonic(), key, Kind.EXPONENTS, 0, 0, len(head), floats // 64,
                    head + bytes(floats // 64))  # raw bytes, not zlib
    assert call.finished
    assert f"server {key[1]}" in str(call.error) and "inflate" in str(call.error)


def test_an_abort_goes_out_with_a_here_behind_it():
    """A lost ABORT with nothing behind it waits for TCP's timeout (200 ms), long enough for a
    neighbour holding the whole sum to return it and leave the re-run without it
    (``tests/test_sim.py``, seed 90040 at 2% loss): a HERE follows it, written on its own,
    so that the ABORT is SACKed past and re-sent within a round trip."""
    mesh = Mesh(1, 0, Topology.parse("star:2"), 1.0, connect=False)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near, far = connected_pair(listener)
        writes: list[int] = []
        peer = Peer(1, 0, near)
        flush = peer.flush
        peer.flush = lambda: (writes.append(peer.outbox.size), flush())[1]
        mesh.peers = {(0, 1): peer}
        mesh.abort(7, "switch s0 (level 0) stopped answering", {(0, 0)})
        first, second = writes[:2]
        assert second == MESSAGE.size  # two writes, so two segments: the HERE alone
        data = bytearray()
        far.settimeout(2.0)
        while len(data) < first + second:
            data += far.recv(1 << 16)
        kind, call, *_rest, payload = decode_message(data)
        assert (kind, call) == (Kind.ABORT, 7) and first == MESSAGE.size + len(payload)
        assert abort_reason(payload).broken == {(0, 0)}
        assert decode_message(data[first:])[:2] == (Kind.HERE, 7)
        near.close()
        far.close()


class _FollowsDetours:
    """A ``SlowMesh`` whose worker plans a detour a neighbour's greeting asks it to."""

    asking = False

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.followed: list[tuple[int, int]] = []

    def poll(self, missing: set[int], expired: bool) -> bool:
        return False

    def went_around(self, level: int, server: int) -> bool:
        self.followed.append((level, server))
        self.mesh.detours = {**self.mesh.detours, level: 1 - level}
        return True


def _make_meshes(detours: dict[int, dict[int, int]]) -> tuple[list[Mesh], list[_FollowsDetours],
                                                                 float]:
    """bcube:2,2 on loopback, server s planning ``detours[s]``; every mesh established at
    once. Returns the meshes, their ``SlowMesh``es and how long it took."""
    topology = Topology.parse("bcube:2,2")
    addresses = [(f"127.0.{40 + s}.1", f"127.0.{40 + s}.2") for s in range(4)]
    meshes = [Mesh(77, s, topology, 5.0, detours.get(s), addresses, connect=False)
              for s in range(4)]
    slow = [_FollowsDetours(mesh) for mesh in meshes]
    errors: dict[int, MeshError] = {}

    def establish(server: int) -> None:
        try:
            meshes[server].establish(5.0, slow[server])
        except MeshError as exc:
            errors[server] = exc

    threads = [threading.Thread(target=establish, args=(s,)) for s in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    took = time.monotonic() - started
    if errors:
        for mesh in meshes:
            mesh.close(linger=0.0)
    assert not errors, errors
    return meshes, slow, took


def _passes_a_message(near: Mesh, far: Mesh, key: tuple[int, int], back: tuple[int, int]) -> bool:
    near.peers[key].send(Kind.HERE)
    near.peers[key].flush()
    sock = far.peers[back].sock
    sock.setblocking(True)
    return decode_message(read_message(sock, time.monotonic() + 2.0))[0] == Kind.HERE


def test_a_neighbour_dialling_over_its_detour_makes_this_worker_plan_it_too():
    """bcube:2,2: server 0 found its level-1 switch silent (it goes around it over level 0);
    server 2, its level-1 neighbour, did not. Server 0 dials over the detour and says so;
    server 2 plans the same detour at once (a neighbour's link to the switch may be down,
    which only that neighbour sees), and the connection carries messages."""
    meshes, slow, took = _make_meshes({0: {1: 0}})
    try:
        assert took < 2.0
        assert slow[2].followed == [(1, 0)] and meshes[2].detours == {1: 0}
        assert _passes_a_message(meshes[0], meshes[2], (1, 2), (1, 0))
    finally:
        for mesh in meshes:
            mesh.close(linger=0.0)


def test_an_acceptor_that_goes_around_a_switch_turns_a_direct_dial_around():
    """bcube:2,2: server 2 goes around its level-1 switch, server 0 does not. Server 0's
    direct dial is answered "go around": server 0 plans the detour and dials over it."""
    meshes, slow, took = _make_meshes({2: {1: 0}})
    try:
        assert took < 2.0
        assert slow[0].followed == [(1, 2)] and meshes[0].detours == {1: 0}
        assert _passes_a_message(meshes[2], meshes[0], (1, 0), (1, 2))
    finally:
        for mesh in meshes:
            mesh.close(linger=0.0)
