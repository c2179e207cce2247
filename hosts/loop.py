"""The host agent's one event loop, and the NIC sockets it owns.

A call (``hosts.call.Call`` on every NIC of a BCube server, ``hosts.single.SingleSwitchCall``
on one NIC) is a state machine without I/O. ``drive`` feeds it what arrives on the NICs' UDP
sockets and the mesh's TCP connections, and when its timer is due, and sends what it asks to
send, until it has failed, or completed and everything it sent has left. Frames move in
batches (``bml.sockets``): one recvmmsg takes up to ``BATCH`` datagrams from a NIC, one
sendmmsg hands a NIC's share of what the call asks to send to the kernel.
"""

from __future__ import annotations

import select
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol

from bml.protocol import BML_UDP_PORT, MTU, job_udp_port
from bml.sockets import BATCH, QUEUE_FULL, BatchReceiver, BatchSender, force_buffers
from hosts.errors import TransportError
from hosts.mesh import Peer

RECV_BATCH = 4096  # datagrams read from one NIC before the loop looks at the others
POLL_CAP = 0.01  # s: the loop wakes at least this often (paced mesh connections)


@dataclass
class NicSocket:
    """One NIC's UDP socket to its switch, and the frames the kernel could not take yet.

    A frame the kernel refuses for another reason than a full queue (the NIC is down) is
    dropped and counted: the switch watch then finds the switch silent and the call is
    re-planned around it, as for any frame lost on the way. Frames go in batches (one
    sendmmsg each) and come in batches (``receiver``: a ring of ``BATCH`` MTU-sized
    buffers, one recvmmsg each)."""

    level: int
    ip: str
    switch_ip: str
    sock: socket.socket
    outbox: deque = field(default_factory=deque)
    refused: int = 0
    sender: BatchSender = field(default_factory=lambda: BatchSender(BATCH, MTU), repr=False)
    receiver: BatchReceiver = field(default_factory=lambda: BatchReceiver(BATCH, MTU),
                                    repr=False)

    def __post_init__(self) -> None:
        self.destination = (self.switch_ip, BML_UDP_PORT)

    @classmethod
    def open(cls, level: int, ip: str, switch_ip: str, job: int) -> NicSocket:
        """A non-blocking socket bound to the job's port on ``ip``."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        force_buffers(sock)
        try:
            sock.bind((ip, job_udp_port(job)))
        except OSError as exc:
            sock.close()
            raise TransportError(f"cannot bind {ip}:{job_udp_port(job)} for job {job}: "
                                 f"{exc}") from None
        sock.setblocking(False)
        return cls(level, ip, switch_ip, sock)

    def send(self, frame: bytes) -> None:
        self.send_many([frame])

    def send_many(self, frames: list[bytes]) -> None:
        """Send ``frames`` in order (behind any the outbox holds): what the kernel cannot
        take for a full queue waits in the outbox; a frame it refuses otherwise is dropped
        and counted in ``refused``."""
        if self.outbox:
            self.outbox.extend(frames)
            return
        while frames:
            sent, err = self.sender.send(self.sock, frames, self.destination)
            if not err:
                return
            if err in QUEUE_FULL:
                self.outbox.extend(islice(frames, sent, None))
                return
            self.refused += 1
            frames = frames[sent + 1:]

    def drain(self) -> None:
        """Send what the outbox holds, a batch per system call, until the queue is full."""
        outbox, send, batch = self.outbox, self.sender.send, self.sender.count
        while outbox:
            frames = list(islice(outbox, batch))
            sent, err = send(self.sock, frames, self.destination)
            for _ in range(sent):
                outbox.popleft()
            if err:
                if err in QUEUE_FULL:
                    return
                self.refused += 1
                outbox.popleft()


class Drivable(Protocol):
    """What ``drive`` needs of a call."""

    result: object
    error: Exception | None
    started: float
    timeout: float

    def on_frame(self, now: float, level: int, data: memoryview) -> None: ...
    def on_message(self, now: float, key, *message) -> None: ...
    def on_closed(self, now: float, key) -> None: ...
    def on_timer(self, now: float) -> None: ...
    def on_sent(self, now: float) -> None: ...
    def next_wake(self) -> float: ...
    def take_frames(self) -> list[tuple[int, bytes]]: ...
    def take_messages(self) -> list[tuple[object, bytes]]: ...
    def cut_off(self, key) -> bool: ...


def drive(call: Drivable, links: list[NicSocket], peers: dict[tuple[int, int], Peer],
          tag: int, who: str) -> None:
    """The one loop: sockets in, the call's inputs; the call's outputs, sockets out. It
    returns once the call failed, or completed and everything it sent has left (but to
    neighbours it is cut off from). ``tag``:
    the call's, in the mesh messages that are its own; ``who`` names the worker in errors."""
    by_fd = {link.sock.fileno(): link for link in links}
    peer_fd = {peer.sock.fileno(): (key, peer) for key, peer in peers.items()}
    poll = select.poll()
    for link in links:
        poll.register(link.sock, select.POLLIN)
    watched: dict[int, int] = {}  # peer fd -> the events it is registered for
    reported: set = set()  # peers whose closing the call was told of
    # Messages of this call may already wait in an inbox (a neighbour one call ahead, or
    # read with the last call's end): poll() will not report those again.
    for key, peer in peers.items():
        _deliver(call, key, peer, tag)
    while True:
        _send(call, links, peers)
        if call.error is not None:
            return
        if call.result is not None and not any(link.outbox for link in links) \
                and not any(p.outbox for key, p in peers.items() if not call.cut_off(key)):
            return  # (what waits for a neighbour a failure cut off never leaves)
        now = time.monotonic()
        if call.result is not None and now > call.started + call.timeout:
            raise TransportError(f"{who}: the call's last messages could not be delivered "
                                 f"to the neighbours within {call.timeout:g} s")
        for fd, (key, peer) in peer_fd.items():
            if peer.closed and key not in reported:
                reported.add(key)
                call.on_closed(now, key)
            if peer.paced:  # held back by its pacing, not by the socket: try again now
                peer.flush()
            wanted = 0 if peer.closed else select.POLLIN | (
                select.POLLOUT if peer.outbox and not peer.paced else 0)
            if watched.get(fd, 0) != wanted:
                if fd in watched:
                    poll.unregister(fd)
                    del watched[fd]
                if wanted:
                    poll.register(fd, wanted)
                    watched[fd] = wanted
        wait = max(0.0, min(call.next_wake() - now, POLL_CAP))
        for fd, event in poll.poll(wait * 1000):
            link = by_fd.get(fd)
            if link is not None:
                _receive(call, link)
                continue
            key, peer = peer_fd[fd]
            if event & select.POLLOUT:
                peer.flush()
            if event & (select.POLLIN | select.POLLHUP | select.POLLERR):
                peer.fill()
                _deliver(call, key, peer, tag)
        for link in links:
            link.drain()
        now = time.monotonic()
        if now >= call.next_wake():
            call.on_timer(now)


def _receive(call: Drivable, link: NicSocket) -> None:
    """Up to ``RECV_BATCH`` datagrams from ``link``, a recvmmsg at a time, each fed to the
    call as a view into the NIC's receive ring (valid for that ``on_frame`` only)."""
    receive, sock, level, on_frame = link.receiver.receive, link.sock, link.level, call.on_frame
    batch = link.receiver.count
    for _ in range(-(-RECV_BATCH // batch)):
        views = receive(sock)
        if not views:
            return
        now = time.monotonic()
        for view in views:
            on_frame(now, level, view)
        if len(views) < batch:
            return  # the socket is drained: no need to ask again


def _deliver(call: Drivable, key: tuple[int, int], peer: Peer, tag: int) -> None:
    now = time.monotonic()
    for message in peer.messages(tag):
        call.on_message(now, key, *message)


def _send(call: Drivable, links: list[NicSocket], peers: dict[tuple[int, int], Peer]) -> None:
    frames = call.take_frames()
    if frames:
        if len(links) == 1:
            links[0].send_many([frame for _level, frame in frames])
        else:
            per_link: list[list[bytes]] = [[] for _ in links]
            for level, frame in frames:
                per_link[level].append(frame)
            for link, share in zip(links, per_link, strict=True):
                if share:
                    link.send_many(share)
        call.on_sent(time.monotonic())
    for key, message in call.take_messages():
        peers[key].queue(message)
