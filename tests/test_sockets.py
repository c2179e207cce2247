"""Batched datagram I/O (``bml.sockets``: recvmmsg/sendmmsg through ctypes, and the per-frame
fallback with the same interface): on loopback UDP sockets, an AF_UNIX pair (a queue that
fills), and a veth pair in a namespace of the test's own (AF_PACKET, with the VLAN tag the
kernel reports beside a frame)."""

from __future__ import annotations

import errno
import os
import socket
import struct
import time

import numpy as np
import pytest

from bml import sockets
from bml.protocol import MTU
from bml.sockets import QUEUE_FULL, BatchReceiver, BatchSender
from emulation.testbed import have_netns
from soft_target.switch import (
    _AUX_RING,
    _AUXDATA_SPACE,
    ETH_P_ALL,
    PACKET_AUXDATA,
    PACKET_IGNORE_OUTGOING,
    SOL_PACKET,
    _tagged_any,
    as_on_wire,
    from_control_ring,
)
from tests.kit.namespaces import add_veth, delete_namespace, fresh_namespace, in_netns

IP_PKTINFO = 8  # Linux; not exported by Python's socket module


@pytest.fixture(params=["batched", "fallback"])
def mode(request, monkeypatch) -> str:
    """Every test runs on recvmmsg/sendmmsg and on the per-frame fallback."""
    if request.param == "batched":
        if not sockets.BATCHED:
            pytest.skip("no recvmmsg/sendmmsg here")
    else:
        monkeypatch.setattr(sockets, "_LIBC", None)
    return request.param


@pytest.fixture
def udp_pair():
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for sock in (a, b):
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    yield a, b
    a.close()
    b.close()


def receive_all(receiver: BatchReceiver, sock: socket.socket) -> list[list[bytes]]:
    """Every batch queued on ``sock``, as lists of copies."""
    batches = []
    while views := receiver.receive(sock):
        batches.append([bytes(view) for view in views])
    return batches


def test_udp_round_trip_in_batches(mode, udp_pair):
    a, b = udp_pair
    frames = [bytes([i]) * (1 + 37 * i) for i in range(150)]
    frames += [bytearray(b"a bytearray"), memoryview(b"a memoryview"), bytes(MTU - 28)]
    assert BatchSender().send(a, frames, b.getsockname()) == (len(frames), 0)
    receiver = BatchReceiver(count=32, size=MTU)
    batches = receive_all(receiver, b)
    assert [f for batch in batches for f in batch] == [bytes(f) for f in frames]
    assert [len(batch) for batch in batches] == [32, 32, 32, 32, 25]
    assert receiver.receive(b) == []  # nothing queued: at once, no error


def test_views_are_the_ring_and_limit(mode, udp_pair):
    a, b = udp_pair
    sender = BatchSender(count=4)  # 10 frames: three sendmmsg calls
    assert sender.send(a, [bytes([i]) * 10 for i in range(10)], b.getsockname()) == (10, 0)
    receiver = BatchReceiver(count=8, size=64)
    views = receiver.receive(b, limit=3)
    assert [bytes(v) for v in views] == [bytes([i]) * 10 for i in range(3)]
    assert views[0].obj is receiver.buffer  # no copy: a view into the receiver's ring
    assert not receiver.truncated(0)
    assert [bytes(v) for v in receiver.receive(b)] == [bytes([i]) * 10 for i in range(3, 10)]


def test_truncated_frame(mode, udp_pair):
    a, b = udp_pair
    BatchSender().send(a, [bytes(100)], b.getsockname())
    receiver = BatchReceiver(count=2, size=64)
    assert [len(v) for v in receiver.receive(b)] == [64]
    assert receiver.truncated(0)


def test_ancillary_data_per_frame(mode, udp_pair):
    a, b = udp_pair
    b.setsockopt(socket.SOL_IP, IP_PKTINFO, 1)
    BatchSender().send(a, [b"one", b"two", b"three"], b.getsockname())
    receiver = BatchReceiver(count=8, size=64, control=socket.CMSG_SPACE(12))
    assert len(receiver.receive(b)) == 3
    index = struct.pack("=i", socket.if_nametoindex("lo"))
    loopback = socket.inet_aton("127.0.0.1")
    for i in range(3):
        assert receiver.ancillary(i) == [(socket.SOL_IP, IP_PKTINFO,
                                          index + loopback + loopback)]
    assert BatchReceiver(count=1).ancillary(0) == []  # no control buffers kept


def test_parse_ancillary_matches_recvmsg(udp_pair):
    """The batched path parses the control buffer itself; recvmsg's parse is the reference."""
    a, b = udp_pair
    b.setsockopt(socket.SOL_IP, IP_PKTINFO, 1)
    b.setsockopt(socket.SOL_IP, socket.IP_RECVTOS, 1)
    BatchSender().send(a, [b"x"], b.getsockname())
    space = socket.CMSG_SPACE(12) + socket.CMSG_SPACE(1)
    receiver = BatchReceiver(count=1, size=64, control=space)
    assert len(receiver.receive(b)) == 1
    batched = receiver.ancillary(0) if sockets.BATCHED else None
    BatchSender().send(a, [b"x"], b.getsockname())
    b.setblocking(True)
    _data, reference, _flags, _address = b.recvmsg(64, space)
    assert len(reference) == 2
    if batched is not None:
        assert batched == reference


def test_queue_full_and_refusal(mode):
    """A full queue stops the batch at the first frame that did not go, with EAGAIN; a frame
    refused for another reason does too, with its own errno."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        a.setblocking(False)
        frames = [bytes([i % 256]) * 1000 for i in range(5000)]
        sent, err = BatchSender().send(a, frames)
        assert 0 < sent < len(frames)
        assert err in QUEUE_FULL
        received = [bytes(v) for v in BatchReceiver(count=8, size=2048).receive(b)]
        assert received == frames[:len(received)]
    finally:
        a.close()
        b.close()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.setblocking(False)
        assert BatchSender().send(udp, [b"x", b"y"], ("127.0.0.1", 0)) == (0, errno.EINVAL)
    finally:
        udp.close()


def test_rows_sent_and_received_in_place(mode):
    """A 2-D array's rows (here every third row of a block, as a result block's copies to one
    port lie) go out in order as frames, in more than one sendmmsg, and come in as the rows of
    the receiver's ring with their lengths; a full queue stops them as it stops ``send``."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        a.setblocking(False)
        block = np.arange(30 * 3 * 40, dtype=np.uint32).astype(np.uint8).reshape(30, 3, 40)
        rows = block[:, 1]  # rows 120 bytes apart, each 40 bytes in one run
        assert BatchSender(count=8).send_rows(a, rows) == (30, 0)
        receiver = BatchReceiver(count=16, size=64)
        got = []
        while len(lengths := receiver.receive_rows(b)):
            assert lengths.dtype == np.int64
            got += [receiver.rows[i, :size].tobytes() for i, size in enumerate(lengths)]
        assert got == [row.tobytes() for row in rows]
        assert len(receiver.receive_rows(b)) == 0  # nothing queued: at once, no error
        big = np.zeros((5000, 1000), np.uint8)
        big[:, 0] = np.arange(5000) % 256
        sent, err = BatchSender().send_rows(a, big)
        assert 0 < sent < len(big)
        assert err in QUEUE_FULL
        lengths = receiver.receive_rows(b)
        assert [receiver.rows[i, 0] for i in range(len(lengths))] == list(range(len(lengths)))
        with pytest.raises(ValueError, match="one run of bytes"):
            BatchSender().send_rows(a, np.zeros((4, 3), np.uint8).T)
    finally:
        a.close()
        b.close()


def test_sender_rejects_a_copy_too_big(mode, udp_pair):
    a, b = udp_pair
    sender = BatchSender(count=2, size=16)
    assert sender.send(a, [bytes(100)], b.getsockname()) == (1, 0)  # bytes: not copied
    if sockets._LIBC is not None:
        with pytest.raises(ValueError):
            sender.send(a, [bytearray(100)], b.getsockname())


NETNS_REASON = have_netns()


@pytest.mark.netns
@pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")
def test_veth_af_packet_batches_with_vlan_tags(mode):
    """Frames sent with one sendmmsg on a veth arrive on its peer as they were sent, read with
    recvmmsg; a VLAN tag the kernel strips comes back from each frame's PACKET_AUXDATA."""
    namespace = f"bmlsock{os.getpid()}"
    fresh_namespace(namespace)
    try:
        add_veth(namespace, "sa", "sb")

        def sockets_in_namespace() -> tuple[socket.socket, socket.socket]:
            out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            out.bind(("sa", 0))
            out.setblocking(False)
            into = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            into.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            into.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
            into.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            into.bind(("sb", 0))
            into.setblocking(False)
            return out, into

        out, into = in_netns(namespace, sockets_in_namespace)
        try:
            macs = bytes.fromhex("02000000000b02000000000a")
            frames = []
            for i in range(100):
                if i % 3 == 0:  # 802.1Q, VLAN i, then an experimental EtherType
                    frames.append(macs + struct.pack("!HHH", 0x8100, i, 0x88B5) + bytes([i]) * 60)
                else:
                    frames.append(macs + struct.pack("!H", 0x88B5) + bytes([i]) * (46 + 89 * i))
            frames.append(macs + struct.pack("!H", 0x88B5) + bytes(MTU))  # the largest
            assert BatchSender().send(out, frames) == (len(frames), 0)
            receiver = BatchReceiver(count=16, control=_AUXDATA_SPACE)
            got = []
            for _ in range(200):
                views = receiver.receive(into)
                for i, view in enumerate(views):  # the generic parse, and the switch's own
                    frame = as_on_wire(view, receiver.ancillary(i))
                    assert from_control_ring(view, receiver.control_buffer,
                                             i * _AUXDATA_SPACE) == frame
                    got.append(frame)
                if len(got) >= len(frames):
                    break
                if not views:
                    time.sleep(0.01)  # a moment for the veth to deliver
            assert got == frames
            # The switch's batch path: the frames as rows of the ring, and whether any of a
            # batch had its tag taken out (then the batch goes through ``from_control_ring``).
            assert BatchSender().send(out, frames) == (len(frames), 0)
            aux = np.frombuffer(receiver.control_buffer, _AUX_RING)
            seen = 0
            for _ in range(200):
                lengths = receiver.receive_rows(into)
                for i, size in enumerate(lengths.tolist()):
                    frame = frames[seen + i]
                    tagged = frame[12:14] == b"\x81\x00"
                    assert _tagged_any(aux[i:i + 1]) == tagged
                    untagged = frame[:12] + frame[16:] if tagged else frame
                    assert receiver.rows[i, :size].tobytes() == untagged
                seen += len(lengths)
                if seen >= len(frames):
                    break
                if not len(lengths):
                    time.sleep(0.01)
            assert seen == len(frames)
        finally:
            out.close()
            into.close()
    finally:
        delete_namespace(namespace)
