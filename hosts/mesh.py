"""The host-to-host side of a worker: one TCP connection to every neighbour on every level.

BCube servers on one switch exchange directly (the switch only forwards): the host-based
steps' partial sums, the exponent exchange that starts every call, repairs of lost
broadcasts, and the DONE that ends a call. Each message is a 16-byte header and a payload:

    kind (1) | call (1) | stripe (1) | step (1) | start (4) | count (4) | payload bytes (4)

``call`` is the caller's call number mod 256: a neighbour can be one call ahead (it finished
when this worker said DONE), never two, and a late repair can be one call behind.

Sockets are non-blocking and driven by the worker's one event loop (``hosts/engine.py``):
``send`` queues and writes what the kernel takes, ``flush`` writes more when the socket is
writable, ``receive`` returns whole messages. The lower-numbered server of a pair connects.
"""

from __future__ import annotations

import enum
import errno
import json
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from bml.protocol import mesh_tcp_port
from bml.schedule import connection_limit
from bml.sockets import QUEUE_BUDGET, StreamInbox, StreamOutbox, unacked_bytes
from bml.topology import Topology
from hosts.connector import MeshConnector, Verdict

if TYPE_CHECKING:
    import numpy as np

    Payload = bytes | bytearray | memoryview | np.ndarray

MESSAGE = struct.Struct("!BBBBIII")
RECV_CHUNK = 1 << 18
# The least TCP retransmission timeout (socket option TCP_RTO_MIN_US, Linux >= 6.15) of a mesh
# that carries only control messages at a call's start and end over idle links
# (``bml.schedule.mesh_is_control_only``). Linux's 200 ms is sized for wide areas: between
# neighbours (sub-millisecond base RTT) a lost segment of the exponent exchange or of DONE
# would hold the whole call for 200 ms, doubled at each loss after it, while the links are
# idle. Not where the mesh carries messages mid-call (streams, repairs): they wait behind the
# frames in queues far longer than the RTT TCP learnt, and a short least timeout would re-send
# them spuriously, into those same queues.
TCP_RTO_MIN_US = 45
CONTROL_RTO_MIN_US = 20_000


class SlowMesh(Protocol):
    """What ``Mesh.establish`` asks while neighbours have not connected yet (``Engine``:
    whether their levels' switches are dead, and if so the re-planned detours)."""

    def poll(self, missing: set[int], expired: bool) -> bool:
        """``missing``: the levels still missing neighbours; ``expired``: the wait is over.
        True: ``Mesh.detours`` changed (re-planned), and the wait starts again."""
        ...

    def went_around(self, level: int, server: int) -> bool:
        """Neighbour ``server``'s plan goes around ``level``'s switch: re-plan around it too
        (True: ``Mesh.detours`` changed)."""
        ...

    @property
    def asking(self) -> bool:
        """Still finding out: the mesh does not fail yet."""
        ...


class MeshError(RuntimeError):
    pass


@dataclass(frozen=True)
class AbortReason:
    """What an ABORT says: why, the groups that failed, the servers that left, and whether
    its sender returned the whole sum (``summed``: it needs nothing more, like a DONE, and
    does not run the call again) or gives up on the call and runs it again."""

    reason: str
    broken: frozenset[tuple[int, int]] = frozenset()
    lost: frozenset[int] = frozenset()
    summed: bool = False


def abort_reason(payload: bytes | memoryview) -> AbortReason:
    """What an ABORT's payload says."""
    try:
        info = json.loads(bytes(payload))
        return AbortReason(str(info["reason"]),
                           frozenset((int(level), int(index)) for level, index in info["broken"]),
                           frozenset(int(server) for server in info.get("lost", ())),
                           bool(info.get("summed", False)))
    except (ValueError, KeyError, TypeError):
        return AbortReason(bytes(payload).decode(errors="replace"))


class Kind(enum.IntEnum):
    HELLO = 1  # payload: JSON {job, server, dim}
    EXPONENTS = 2  # payload: JSON head + block exponents (the call's barrier)
    CONTRIB = 3  # host-based reduce-scatter: my contribution to blocks you own
    FINAL = 4  # reduced blocks: host-based all-gather, or a repair
    SENT = 5  # I have broadcast all my blocks of (stripe, step) through the switch
    NEED = 6  # please re-send these reduced blocks (broadcast copies were lost)
    DONE = 7  # I have the whole result: I need nothing more from you this call
    ABORT = 8  # I give up on this call; payload: JSON {reason, broken, lost, summed}, so you can
    # name the cause and re-plan alike: broken: [[level, switch index]] of a failed switch or
    # link, lost: [server] of workers that left (an elastic job goes on without them); summed:
    # I returned the whole sum all the same (a failure kept only DONEs away)
    HERE = 9  # I am still in this call: sent while nothing else goes to you and I miss blocks,
    # and right behind EXPONENTS, DONE and ABORT, so that a lost one is SACKed past
    # (``Call._trail``, ``abort_messages``)


def encode_message(kind: Kind, call: int = 0, stripe: int = 0, step: int = 0, start: int = 0,
                   count: int = 0, payload: Payload = b"") -> bytes:
    """One message as it goes on the wire. ``payload`` is any C-contiguous buffer (blocks of
    lanes as a numpy array): it is copied once, into the message, and no more (a payload of
    16 wide blocks is 141 KB, and every such object made and dropped costs fresh pages)."""
    with memoryview(payload) as view:
        size = view.nbytes
    return b"".join((MESSAGE.pack(kind, call, stripe, step, start, count, size), payload))


def decode_message(data: bytes | memoryview) -> tuple[int, int, int, int, int, int, bytes]:
    """(kind, call, stripe, step, start, count, payload) of one encoded message."""
    kind, call, stripe, step, start, count, size = MESSAGE.unpack_from(data)
    return kind, call, stripe, step, start, count, bytes(data[MESSAGE.size:MESSAGE.size + size])


def abort_message(call: int, reason: str, broken: set[tuple[int, int]] | None = None,
                  lost: set[int] | None = None, summed: bool = False) -> bytes:
    """An ABORT: why a worker gives up on ``call`` (or, ``summed``, returned its sum in spite of
    a failure), and which groups failed or which servers left, so that every neighbour names
    the cause and re-plans the same way."""
    payload = json.dumps({"reason": reason[:2000], "broken": sorted(broken or ()),
                          "lost": sorted(lost or ()), "summed": summed}).encode()
    return encode_message(Kind.ABORT, call, payload=payload)


def abort_messages(call: int, reason: str, broken: set[tuple[int, int]] | None = None,
                   lost: set[int] | None = None, summed: bool = False) -> tuple[bytes, bytes]:
    """What a worker giving up on ``call`` writes to each neighbour, in two writes: the ABORT
    (``abort_message``) and a HERE behind it, as behind EXPONENTS and DONE (``Call._trail``):
    a lost ABORT with nothing behind it waits for TCP's timeout (200 ms; 20 ms on a
    control-only mesh), and a neighbour that holds the whole sum may return it meanwhile and
    leave the re-run without it."""
    return abort_message(call, reason, broken, lost, summed), encode_message(Kind.HERE, call)


@dataclass
class Peer:
    server: int
    dim: int
    sock: socket.socket
    inbox: StreamInbox = field(default_factory=lambda: StreamInbox(RECV_CHUNK))
    outbox: StreamOutbox = field(default_factory=StreamOutbox)
    done: bool = False  # its DONE of this call arrived
    closed: bool = False
    sent_bytes: int = 0
    limit: int | None = None  # bytes it may have unacknowledged in the kernel (None: any)
    paced: bool = False  # the last flush stopped at ``limit``: flush again later, not on POLLOUT

    def send(self, kind: Kind, call: int = 0, stripe: int = 0, step: int = 0, start: int = 0,
             count: int = 0, payload: Payload = b"") -> None:
        self.queue(encode_message(kind, call, stripe, step, start, count, payload))

    def queue(self, message: bytes) -> None:
        """Queue an encoded message and write what the kernel takes."""
        self.outbox.queue(message)
        self.flush()

    def flush(self) -> None:
        self.paced = False
        outbox = self.outbox
        while outbox:
            room = outbox.size if self.limit is None else min(
                outbox.size, self.limit - unacked_bytes(self.sock))
            if room <= 0:
                self.paced = True
                return
            try:
                self.sent_bytes += outbox.write(self.sock, room)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise MeshError(f"server {self.server} (level {self.dim}): {exc}") from None

    def fill(self) -> None:
        """Read what the socket has; EOF marks the peer closed."""
        if not self.inbox.fill(self.sock):
            self.closed = True

    def messages(self, call: int):
        """Whole messages of call ``call`` from the inbox (kind, stripe, step, start, count,
        payload); those of the next call stay for it, late ones of the last are dropped."""
        inbox = self.inbox
        data, first, offset, held = inbox.data, inbox.start, inbox.start, inbox.end
        try:
            while held - offset >= MESSAGE.size:
                kind, tag, stripe, step, start, count, size = MESSAGE.unpack_from(data, offset)
                end = offset + MESSAGE.size + size
                if held < end or tag == (call + 1) & 0xFF:
                    break
                offset = end
                if tag != call:
                    continue
                payload = memoryview(data)[end - size:end]
                if kind == Kind.DONE:
                    self.done = True
                try:
                    yield kind, stripe, step, start, count, payload
                finally:
                    payload.release()
        finally:
            inbox.consume(offset - first)


class Mesh:
    """TCP connections of one worker of one job to all its BCube neighbours."""

    def __init__(self, job: int, server: int, topology: Topology, start_timeout: float,
                 detours: dict[int, int] | None = None,
                 addresses: list[tuple[str, ...]] | None = None,
                 budgets: list[int] | None = None, control_only: bool = False,
                 connect: bool = True) -> None:
        """``detours``: level -> the level whose NICs reach this server's neighbours on it
        (their switch failed: the routes through relay servers, ``Topology.detour_routes``,
        carry the connection). ``addresses``: per server of ``topology``, its NICs'
        addresses, when they are not the topology's own (a job shrunk to its survivors).
        ``budgets``: per level, the bytes its connections keep unacknowledged in all (default
        bml.sockets.QUEUE_BUDGET; less where the NIC also carries aggregation frames).
        ``control_only``: the mesh carries only the calls' control messages (a short TCP
        timeout, ``CONTROL_RTO_MIN_US``). ``connect``: establish the connections now; else the
        caller calls ``establish`` (which connects only the neighbours not connected yet)."""
        self.job, self.server, self.topology = job, server, topology
        self.control_only = control_only
        self.detours = dict(detours or {})
        self.budgets = budgets or [QUEUE_BUDGET] * topology.k
        self.addresses = addresses or [tuple(nic.ip for nic in topology.nics(s))
                                       for s in range(topology.num_servers)]
        self.peers: dict[tuple[int, int], Peer] = {}  # (dim, server) -> peer
        if connect:
            self.establish(start_timeout)

    def neighbours(self, dim: int) -> list[Peer]:
        return [self.peers[(dim, s)] for s in self.topology.neighbours(self.server, dim)]

    def all(self) -> list[Peer]:
        return list(self.peers.values())

    def abort(self, call: int, reason: str, broken: set[tuple[int, int]] | None = None,
              lost: set[int] | None = None, linger: float = 0.3, summed: bool = False) -> None:
        """Tell every neighbour still connected why this worker gives up on ``call``
        (``abort_messages``: the ABORT, a HERE behind it), best effort and bounded by
        ``linger``."""
        peers = [peer for peer in self.peers.values() if not peer.closed]
        for outgoing in abort_messages(call, reason, broken, lost, summed):
            for peer in peers:
                try:
                    peer.queue(outgoing)
                except (OSError, MeshError):
                    continue
        deadline = time.monotonic() + linger
        while time.monotonic() < deadline and any(peer.outbox for peer in peers):
            time.sleep(0.01)
            for peer in peers:
                try:
                    peer.flush()
                except (OSError, MeshError):
                    peer.outbox.clear()

    def close(self, linger: float = 2.0) -> None:
        """Half-close every connection and read until the neighbours close theirs (bounded by
        ``linger``): closing with unread data would send a reset, and a reset can destroy
        the last messages (a DONE) still queued at the neighbour's end."""
        open_peers = []
        for peer in self.peers.values():
            try:
                peer.sock.setblocking(True)
                peer.sock.settimeout(linger)
                if peer.outbox:
                    peer.sock.sendall(peer.outbox.drain())
                peer.sock.shutdown(socket.SHUT_WR)
                peer.sock.setblocking(False)
                open_peers.append(peer)
            except OSError:
                pass
        deadline = time.monotonic() + linger
        while open_peers and time.monotonic() < deadline:
            readable, _, _ = select.select([p.sock for p in open_peers], [], [], 0.05)
            for peer in [p for p in open_peers if p.sock in readable]:
                try:
                    if not peer.sock.recv(RECV_CHUNK):
                        open_peers.remove(peer)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    open_peers.remove(peer)
        for peer in self.peers.values():
            peer.sock.close()
        self.peers.clear()

    def establish(self, timeout: float, slow: SlowMesh | None = None) -> None:
        """Connect to every neighbour not connected yet, within ``timeout`` (MeshError).

        ``slow``: polled while neighbours are still missing, with their levels, and the
        listeners stay open (closing one would reset the connections its queue holds, which
        their dialers already use); if it changed ``detours`` (re-planned around a dead
        switch) it returns True and ``timeout`` runs again from then; once ``timeout`` has
        passed the mesh fails when ``slow`` is no longer ``asking``. What to dial, when, and
        what to keep is ``hosts.connector.MeshConnector``'s."""
        topo, me = self.topology, self.server
        port = mesh_tcp_port(self.job)
        listeners = []
        try:
            for dim in range(topo.k):
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    listener.bind((self.addresses[me][dim], port))
                except OSError as exc:
                    raise MeshError(f"cannot listen on {self.addresses[me][dim]}:{port} for job "
                                    f"{self.job}: {exc} (is another worker of this job "
                                    "running on this server?)") from None
                listener.listen(64)
                listener.setblocking(False)
                listeners.append(listener)
            self._establish(listeners, port, timeout, slow)
        finally:
            for listener in listeners:
                listener.close()

    def _establish(self, listeners: list[socket.socket], port: int, timeout: float,
                   slow: SlowMesh | None) -> None:
        """Do on sockets what ``MeshConnector`` decides: dial, greet, accept, adopt."""
        connector = MeshConnector(self.job, self.server, self.topology, self.detours, timeout,
                                  time.monotonic(), self.peers)
        # Accepted, not judged yet -> (the NIC it came in on, its HELLO once read).
        pending: dict[socket.socket, tuple[int, dict | None]] = {}
        dialing: dict[tuple[int, int], socket.socket] = {}  # connecting, or greeting
        try:
            while not connector.done:
                now = time.monotonic()
                expired = connector.expired(now)
                if slow is not None and slow.poll(connector.missing_levels(), expired):
                    connector.replanned(self.detours, now)
                elif expired and (slow is None or not slow.asking):
                    raise MeshError(connector.error())
                for key in connector.stale_dials(now):
                    dialing.pop(key).close()
                for key, via in connector.dials(now):
                    sock = self._dial(key[1], via, port)
                    if sock is None:
                        connector.dial_failed(key, now)
                    else:
                        dialing[key] = sock
                self._dialled(connector, dialing, slow, now)
                for via, listener in enumerate(listeners):
                    while True:
                        try:
                            sock, _ = listener.accept()
                        except (BlockingIOError, InterruptedError):
                            break
                        sock.setblocking(False)
                        pending[sock] = (via, None)
                self._greet(connector, pending, slow)
                time.sleep(0.005)
        finally:
            for sock in [*pending, *dialing.values()]:
                sock.close()

    def _went_around(self, connector: MeshConnector, slow: SlowMesh | None, level: int,
                     other: int) -> bool:
        """The other end's plan goes around ``level``'s switch: this worker's too, if it can
        re-plan (``slow``)."""
        if slow is None or not slow.went_around(level, other):
            return False
        connector.replanned(self.detours, time.monotonic())
        return True

    def _dial(self, other: int, via: int, port: int) -> socket.socket | None:
        """A non-blocking connect to server ``other`` over NIC level ``via`` (None: it
        could not start, e.g. the address is gone)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind((self.addresses[self.server][via], 0))
            err = sock.connect_ex((self.addresses[other][via], port))
        except OSError:
            err = errno.EADDRNOTAVAIL
        if err in (0, errno.EINPROGRESS):
            return sock
        sock.close()
        return None

    def _dialled(self, connector: MeshConnector, dialing: dict[tuple[int, int], socket.socket],
                 slow: SlowMesh | None, now: float) -> None:
        """The dialler's side: a HELLO on each dial that connected, and the acceptor's
        answer read; adopt what it kept, close the rest."""
        if not dialing:
            return
        _r, ready, _x = select.select(
            [], [sock for key, sock in dialing.items() if not connector.greeting(key)], [], 0)
        for key, sock in list(dialing.items()):
            if connector.greeting(key):
                answer = self._read_hello(sock)
                if answer is None:
                    continue  # not in yet
                verdict = connector.answered(key, answer, now)
                if verdict is Verdict.DETOUR:
                    if self._went_around(connector, slow, *key):
                        verdict = connector.answered(key, answer, now)
                    else:
                        connector.dial_failed(key, now)
                del dialing[key]
                if verdict is Verdict.ADOPT:
                    self._adopt(sock, *key)
                else:
                    sock.close()
            elif sock in ready:
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) \
                        and connector.dial_connected(key, now) \
                        and _say_hello(sock, connector.hello(key)):
                    continue
                connector.dial_failed(key, now)
                del dialing[key]
                sock.close()

    def _greet(self, connector: MeshConnector,
               pending: dict[socket.socket, tuple[int, dict | None]],
               slow: SlowMesh | None) -> None:
        """The acceptor's side: read each accepted connection's HELLO, answer it, and adopt
        what the connector keeps."""
        for sock, (via, hello) in list(pending.items()):
            if hello is None:
                hello = self._read_hello(sock)
                if hello is None:
                    continue  # not in yet
            verdict, (dim, other), answer = connector.accepted(hello, via)
            if verdict is Verdict.DETOUR:
                if self._went_around(connector, slow, dim, other):
                    verdict, _key, answer = connector.accepted(hello, via)
                else:
                    verdict, answer = Verdict.REFUSE, None
            del pending[sock]
            if answer is not None:
                _say_hello(sock, answer)
            if verdict is Verdict.ADOPT:
                self._adopt(sock, dim, other)
            else:
                sock.close()

    def _adopt(self, sock: socket.socket, dim: int, other: int) -> None:
        old = self.peers.get((dim, other))
        if old is not None:  # its dialler gave up on it and dialled again
            old.sock.close()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)
        if self.control_only:
            try:  # older kernels keep their 200 ms
                sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US, CONTROL_RTO_MIN_US)
            except OSError:
                pass
        # Each NIC receives from its n - 1 neighbours on that level at once: pace every
        # connection to its share of the link's queue (``budgets``).
        budget = self.budgets[self.detours.get(dim, dim)]  # the NIC it goes through
        limit = connection_limit(budget, self.topology.n)
        self.peers[(dim, other)] = Peer(other, dim, sock, limit=limit)

    @staticmethod
    def _read_hello(sock: socket.socket) -> dict | None:
        try:
            head = sock.recv(MESSAGE.size, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return {}
        if len(head) < MESSAGE.size:
            return None if head else {}
        kind, *_rest, size = MESSAGE.unpack(head)  # HELLO travels as call 0
        if kind != Kind.HELLO or size > 4096:
            return {}
        try:
            data = sock.recv(MESSAGE.size + size, socket.MSG_PEEK)
        except OSError:
            return {}
        if len(data) < MESSAGE.size + size:
            return None
        sock.recv(MESSAGE.size + size)
        return hello_of(data)


def hello_message(greeting: dict) -> bytes:
    """A greeting (``MeshConnector.hello``, or an acceptor's answer) as a HELLO message."""
    return encode_message(Kind.HELLO, payload=json.dumps(greeting).encode())


def _say_hello(sock: socket.socket, greeting: dict) -> bool:
    """Send a greeting on a fresh connection (it fits the empty send buffer); False if the
    connection is gone."""
    try:
        return sock.send(hello_message(greeting)) > 0
    except OSError:
        return False


def hello_of(message: bytes | memoryview) -> dict:
    """The HELLO ``message`` holds (empty: it is no valid HELLO)."""
    try:
        kind, *_rest, payload = decode_message(message)
        hello = json.loads(bytes(payload)) if kind == Kind.HELLO else {}
    except (ValueError, struct.error):
        return {}
    return hello if isinstance(hello, dict) else {}


def queue_full(exc: OSError) -> bool:
    """A send that only found the queue full (the caller keeps the frame and tries again)."""
    return exc.errno in (errno.ENOBUFS, errno.EAGAIN, errno.EWOULDBLOCK)
