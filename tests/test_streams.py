"""Stream socket buffers (``bml.sockets.StreamOutbox``, ``StreamInbox``): what the TCP mesh
and the parameter-server baseline queue and read, on an AF_UNIX stream pair whose buffer
fills; and the encoding of a message whose payload is an array (``hosts.mesh``)."""

from __future__ import annotations

import platform
import socket

import numpy as np
import pytest

from bml.sockets import StreamInbox, StreamOutbox
from hosts.buffers import keep_freed_heap
from hosts.mesh import Kind, decode_message, encode_message


@pytest.fixture
def pair():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for sock in (left, right):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
    yield left, right
    left.close()
    right.close()


def read_all(sock: socket.socket) -> bytes:
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk


def test_outbox_writes_every_part_in_order_across_a_full_buffer(pair):
    left, right = pair
    parts = [b"head", bytearray(b"x" * 5000), np.arange(3000, dtype=">i4").reshape(3, 1000),
             memoryview(b"tail" * 2000), b""]
    outbox = StreamOutbox()
    outbox.queue(*parts)
    expected = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert outbox.size == len(expected)
    received = bytearray()
    while outbox:
        try:
            outbox.write(left)
        except BlockingIOError:
            pass  # the kernel's buffer is full: what it did not take stays queued
        received += read_all(right)
    received += read_all(right)
    assert bytes(received) == expected
    assert outbox.size == 0


def test_outbox_hands_over_at_most_what_it_is_allowed(pair):
    left, right = pair
    outbox = StreamOutbox()
    outbox.queue(b"a" * 100, b"b" * 100, b"c" * 100)
    assert outbox.write(left, 150) == 150
    assert read_all(right) == b"a" * 100 + b"b" * 50
    assert outbox.size == 150
    assert outbox.drain() == b"b" * 50 + b"c" * 100
    assert not outbox
    outbox.queue(b"d")
    outbox.clear()
    assert not outbox and outbox.size == 0


def test_inbox_keeps_what_is_not_taken_grows_for_a_backlog_and_sees_the_end(pair):
    left, right = pair
    inbox = StreamInbox(chunk=64)
    sent = bytes(range(256)) * 8
    left.sendall(sent[:1000])
    assert inbox.fill(right)
    assert len(inbox) == 1000 and len(inbox.data) >= 1000  # grown past 2 x 64
    assert bytes(inbox.data[inbox.start:inbox.end]) == sent[:1000]
    inbox.consume(990)  # ten bytes left: the fill that reaches the end moves them to the front
    size = len(inbox.data)
    assert size <= len(sent)  # (2 x 64 doubled up to 2,048)
    left.sendall(sent[1000:size])  # what fills the buffer to its end
    assert inbox.fill(right)
    assert bytes(inbox.data[inbox.start:inbox.end]) == sent[990:size]
    assert inbox.start == 0 and len(inbox.data) == size  # moved, not grown
    inbox.consume(len(inbox))
    assert (inbox.start, inbox.end) == (0, 0)
    left.sendall(b"last")
    left.close()
    assert not inbox.fill(right)  # the peer closed: what it sent before is still there
    assert bytes(inbox.data[inbox.start:inbox.end]) == b"last"


def test_a_message_with_an_array_payload_is_the_message_with_its_bytes():
    blocks = np.arange(2 * 2208, dtype=">i4").reshape(2, 2208)
    message = encode_message(Kind.FINAL, 7, 1, 0, 32, 2, blocks)
    assert message == encode_message(Kind.FINAL, 7, 1, 0, 32, 2, blocks.tobytes())
    kind, call, stripe, step, start, count, payload = decode_message(message)
    assert (kind, call, stripe, step, start, count) == (Kind.FINAL, 7, 1, 0, 32, 2)
    assert np.array_equal(np.frombuffer(payload, ">i4").reshape(2, 2208), blocks)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_worker_keeps_its_freed_heap():
    assert keep_freed_heap()
