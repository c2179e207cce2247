"""A deterministic network in virtual time: the simulator's stand-in for bml-net.

Real bytes go through the real switch pipeline (``soft_target.pipeline.Pipeline``), programmed
from the control plane's own entry functions and compiled as the software target's P4Runtime
server compiles them, so the simulator exercises the code that runs in the emulation. Every
random draw comes from the ``random.Random`` given; nothing reads a clock or starts a thread,
so one seed replays one trace exactly.

The model, stated once:

* A link joins a NIC to its switch port and has two directions (up: host to switch, down:
  switch to host). A direction is a FIFO: a frame of L bytes occupies it for
  (L + 24) * 8 / rate seconds (24: preamble, FCS and inter-frame gap), then arrives ``delay``
  later. Its queue is the work still to serialise when a frame comes, in wire bytes; at
  ``queue`` or more the frame is tail-dropped. Loss and reordering are drawn per frame and
  direction after the frame took its time on the link; a reordered frame arrives
  ``reorder_delay`` late, so later ones overtake it. A link that goes down (or whose switch
  dies) loses what is on it and in its queues.
* A switch takes no time: a frame on port p goes through ``Pipeline.process(p, frame)`` and
  each copy enters the down direction of its egress port's link. A dead switch drops all.
* A host accepts a frame addressed to its NIC (MAC and IPv4), with a valid IPv4 checksum and
  UDP (checksum 0 or valid), and hands the UDP payload to ``deliver_frame``.
* Streams are the hosts' TCP mesh: see ``Network.send_stream``.
"""

from __future__ import annotations

import heapq
import math
import random
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from bml.cost_model import TCP_IP_ETH_OVERHEAD, tcp_segment_payload
from bml.protocol import BML_UDP_PORT, CONTROLLER_MAGIC, CPU_PORT, DEFAULT_WIRE, Wire
from bml.topology import Switch, Topology, ip_to_int, mac_to_int
from control_plane.admission import admission_entries
from control_plane.aggregation import reset_frames
from control_plane.egress_rewrite import host_address_entries
from control_plane.forwarding import forwarding_entries
from control_plane.jobs import AggregationGroup, JobPlan
from control_plane.p4info import P4Info, built_p4info
from control_plane.result_routing import group_ports, owner_entries
from control_plane.session import Entry, SwitchUnreachable
from soft_target.p4runtime_server import _TABLE_ATTRIBUTE, _compile_table
from soft_target.pipeline import Pipeline

WIRE_OVERHEAD = 24  # bytes per frame on the wire beyond the frame: preamble 8, FCS 4, IFG 12
SEGMENT_PAYLOAD = tcp_segment_payload()  # 9000-byte MTU, IPv4 and TCP with timestamps
SEGMENT_HEADERS = TCP_IP_ETH_OVERHEAD  # counted on the wire per segment, as the cost model does
MIN_RTO = 0.2  # Linux's least retransmission timeout: a lost segment's wait
MAX_BACKOFF = 3.2  # a stalled segment's retry interval doubles from MIN_RTO up to this
DEFAULT_STREAM_WINDOW = 192_000  # bml.sockets.QUEUE_BUDGET: 3/4 of bml-net's 256 KB queue

# Trace kinds (ints: their hash does not depend on PYTHONHASHSEED).
SWITCHED, DELIVERED, DROPPED, LOST, DOWN, DEAD, REJECTED, SEGMENT, MESSAGE = range(9)

_FRAME_HEAD = struct.Struct("!14sBBHHHBBH8sHHHH")  # Ethernet, IPv4, UDP
_IPV4_WORDS = struct.Struct("!10H")
_heappush = heapq.heappush


# ---------------------------------------------------------------------------- clock
class Event:
    """A scheduled callback; ``cancel`` keeps it from running."""

    __slots__ = ("_clock", "cancelled", "done")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.cancelled = False
        self.done = False

    def cancel(self) -> None:
        if not (self.cancelled or self.done):
            self.cancelled = True
            self._clock._cancelled += 1


class Clock:
    """Virtual time and the event queue: events at equal times run in the order scheduled.

    ``run_until(when)`` runs every event due at or before ``when``; ``now`` then ends at
    ``when`` (time passed with nothing to do), or, when ``stop()`` turned true after an event,
    at that event's time. A time in the past is run at ``now``, after the events due then."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self._heap: list[tuple[float, int, Callable[..., None], tuple, Event | None]] = []
        self._sequence = 0
        self._cancelled = 0

    def at(self, when: float, callback: Callable[..., None], *args) -> Event:
        event = Event(self)
        self._push(when, callback, args, event)
        return event

    def after(self, delay: float, callback: Callable[..., None], *args) -> Event:
        return self.at(self.now + delay, callback, *args)

    def _push(self, when: float, callback: Callable[..., None], args: tuple,
              event: Event | None = None) -> None:
        """``at`` without an Event: the network's own events, never cancelled."""
        self._sequence += 1
        heapq.heappush(self._heap, (when if when > self.now else self.now, self._sequence,
                                    callback, args, event))

    def run_until(self, when: float, stop: Callable[[], bool] | None = None) -> None:
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= when:
            time, _, callback, args, event = pop(heap)
            if event is not None:
                if event.cancelled:
                    self._cancelled -= 1
                    continue
                event.done = True
            self.now = time
            callback(*args)
            if stop is not None and stop():
                return
        if self.now < when < math.inf:
            self.now = when

    def pending(self) -> int:
        """Events scheduled and not cancelled."""
        return len(self._heap) - self._cancelled


# ---------------------------------------------------------------------------- tables
def compile_entries(entries: Iterable[Entry], p4info: P4Info | None = None) -> dict[str, dict]:
    """The ``Tables`` attributes that ``entries`` make, compiled as the software target's
    P4Runtime server compiles a write: keys in the P4Info's match-field order, parameters in
    its action's order, values checked against their widths."""
    p4info = p4info or built_p4info()
    rows: dict[str, list] = {}
    for item in entries:
        table, action = p4info.table(item.table), p4info.action(item.action)
        if action.name not in table.actions:
            raise ValueError(f"{item.describe()}: not an action of {table.name}")
        match, params = dict(item.match), dict(item.params)
        key = tuple(_fits(match[name], width, item) for name, (_, width) in
                    table.match_fields.items())
        values = tuple(_fits(params[name], width, item) for name, (_, width) in
                       action.params.items())
        rows.setdefault(table.name, []).append((key, action.name, values))
    return {_TABLE_ATTRIBUTE[name]: _compile_table(name, table_rows)
            for name, table_rows in rows.items()}


def _fits(value: int, width: int, item: Entry) -> int:
    if not 0 <= value < 1 << width:
        raise ValueError(f"{item.describe()}: {value} does not fit in {width} bits")
    return value


def apply_entries(pipeline: Pipeline, entries: Iterable[Entry],
                  p4info: P4Info | None = None) -> None:
    """Add ``entries`` to the pipeline's tables (an entry with the same key is replaced, as a
    write with ``replace``); each table is swapped whole, as the server does."""
    tables = pipeline.tables
    changes = {attribute: {**getattr(tables, attribute), **rows}
               for attribute, rows in compile_entries(entries, p4info).items()}
    pipeline.tables = replace(tables, **changes)


def packet_out_header(p4info: P4Info | None = None) -> bytes:
    """The packet_out header the server puts before a PacketOut's payload: the controller's
    magic, every other field 0."""
    value = width = 0
    for name, (_, bits) in (p4info or built_p4info()).packet_out_metadata.items():
        value = value << bits | (CONTROLLER_MAGIC if name == "magic" else 0)
        width += bits
    return value.to_bytes(width // 8, "big")


# ---------------------------------------------------------------------------- links
@dataclass
class LinkShape:
    rate: float = 1e9  # bits/s each way
    delay: float = 20e-6  # s propagation each way
    queue: int = 256 * 1024  # bytes of queue per direction (tail drop beyond)
    loss: float = 0.0  # probability each frame is dropped, each way
    reorder: float = 0.0  # probability a frame is held back by reorder_delay extra
    reorder_delay: float = 1e-3


@dataclass(slots=True)
class LinkDirection:
    """One direction of a link: its FIFO (busy until when) and what happened on it. Frames
    and bytes are what went onto the wire (lost ones included, dropped ones not)."""

    frames: int = 0
    bytes: int = 0
    dropped: int = 0  # queue full (tail drop)
    lost: int = 0  # random loss
    down: int = 0  # link down, or cut while in flight
    dead: int = 0  # arrived at a dead switch
    rejected: int = 0  # refused by the host (not its address, bad checksum) or no such port
    busy_until: float = 0.0


class _Link:
    __slots__ = ("address_sum", "addresses", "corrupt", "down", "epoch", "ethernet", "ident",
                 "ip", "is_up", "level", "mac", "node", "port", "server", "up")

    def __init__(self, server: int, level: int, port: int, node: _SwitchNode, mac: bytes,
                 ip: bytes, switch_mac: bytes, switch_ip: bytes) -> None:
        self.server, self.level, self.port, self.node = server, level, port, node
        self.mac, self.ip = mac, ip
        self.up, self.down = LinkDirection(), LinkDirection()
        self.is_up, self.epoch, self.corrupt, self.ident = True, 0, 0, 0
        self.ethernet = switch_mac + mac + b"\x08\x00"
        self.addresses = ip + switch_ip
        # IPv4 words every frame of this NIC shares: version/IHL, DF, TTL/UDP, addresses.
        self.address_sum = 0x4500 + 0x4000 + 0x4011 + sum(struct.unpack("!4H", self.addresses))


class _SwitchNode:
    __slots__ = ("links", "pipeline", "switch")

    def __init__(self, switch: Switch, pipeline: Pipeline) -> None:
        self.switch, self.pipeline = switch, pipeline
        self.links: list[_Link | None] = [None] * (len(switch.servers) + 1)  # by port


class _Segment:
    __slots__ = ("attempt", "backoff", "sent", "seq", "size")

    def __init__(self, seq: int, size: int, backoff: float) -> None:
        self.seq, self.size, self.backoff = seq, size, backoff
        self.attempt = 0  # re-sends so far: a retransmission timer set for an earlier one is void
        self.sent = 0.0  # when its latest transmission left the source


class _Connection:
    """One TCP connection along fixed hops: segments in order, a window of bytes in flight."""

    __slots__ = ("ack_delay", "early", "expected", "in_flight", "lost", "messages", "min_rto",
                 "next_seq", "path", "unacked", "waiting", "window")

    def __init__(self, path: list[tuple[_Link, LinkDirection]], ack_delay: float,
                 min_rto: float, window: int) -> None:
        self.path, self.ack_delay, self.min_rto = path, ack_delay, min_rto
        self.window = window
        self.next_seq = self.expected = self.in_flight = self.unacked = 0
        self.early: set[int] = set()  # sequence numbers arrived ahead of a missing one
        # Lost segments no later segment has arrived behind yet (RACK has no evidence yet).
        self.lost: dict[int, _Segment] = {}
        self.messages: deque[tuple[int, Callable[[], None]]] = deque()  # (last seq, callback)
        self.waiting: deque[_Segment] = deque()  # not yet sent: outside the window


# ---------------------------------------------------------------------------- network
class Network:
    """Links, switches and streams of one topology, driven by ``clock``. ``shape`` is read at
    every frame, so changing it mid-run (a phase of loss) takes effect at once."""

    def __init__(self, clock: Clock, topology: Topology, shape: LinkShape, rng: random.Random,
                 deliver_frame: Callable[[int, int, bytes], None], *,
                 stream_window: int = DEFAULT_STREAM_WINDOW,
                 wire: Wire = DEFAULT_WIRE) -> None:
        self.clock, self.topology, self.shape, self.rng = clock, topology, shape, rng
        self.deliver_frame = deliver_frame
        self.stream_window = stream_window
        self.wire = wire  # the lane width of every switch's pipeline
        self._p4info = built_p4info(wire.lanes)
        self._packet_out = packet_out_header(self._p4info)
        self._nodes = {sw.name: _SwitchNode(sw, Pipeline(lanes=wire.lanes))
                       for sw in topology.switches}
        self._links: list[_Link] = []  # index server * k + level
        self.counters: dict[tuple[int, int, str], LinkDirection] = {}
        for server in range(topology.num_servers):
            for nic in topology.nics(server):
                node = self._nodes[nic.switch]
                link = _Link(server, nic.level, nic.port, node,
                             mac_to_int(nic.mac).to_bytes(6, "big"),
                             ip_to_int(nic.ip).to_bytes(4, "big"),
                             mac_to_int(node.switch.mac).to_bytes(6, "big"),
                             ip_to_int(node.switch.ip).to_bytes(4, "big"))
                node.links[nic.port] = link
                self._links.append(link)
                self.counters[(server, nic.level, "up")] = link.up
                self.counters[(server, nic.level, "down")] = link.down
        self._connections: dict[tuple[tuple[int, int], ...], _Connection] = {}
        self._trace = 0

    # ------------------------------------------------------------ provisioning
    def _alive(self, switch_name: str) -> tuple[_SwitchNode, Pipeline]:
        node = self._nodes[switch_name]
        if node.pipeline is None:
            raise SwitchUnreachable(f"switch {switch_name} is dead")
        return node, node.pipeline

    def provision(self, switch_name: str) -> None:
        """Forwarding and host addresses: what ``provision_switch`` writes."""
        node, pipeline = self._alive(switch_name)
        apply_entries(pipeline, forwarding_entries(self.topology, node.switch)
                      + host_address_entries(self.topology, node.switch), self._p4info)

    def install_group(self, group: AggregationGroup) -> None:
        """What ``control_plane.provision.install_group`` does: entries, multicast group, then
        RESET frames for the group's slots in at the CPU port."""
        node, pipeline = self._alive(group.switch)
        apply_entries(pipeline, admission_entries(group) + owner_entries(group), self._p4info)
        pipeline.tables = replace(pipeline.tables, mcast_groups={
            **pipeline.tables.mcast_groups, group.mcast_group: tuple(group_ports(group))})
        for frame in reset_frames(node.switch, group, self.wire):
            pipeline.process(CPU_PORT, self._packet_out + frame)

    def install_job(self, plan: JobPlan) -> None:
        for group in plan.groups:
            self.install_group(group)

    # ------------------------------------------------------------ frames
    def _note(self, kind: int, link: _Link) -> None:
        self._trace = hash((self._trace, self.clock.now, kind, link.server, link.level))

    def send_frame(self, server: int, level: int, src_port: int, udp_payload: bytes) -> None:
        """What a UDP socket on NIC ``level`` does with sendto((switch ip, BML_UDP_PORT)):
        Ethernet/IPv4 (DF, TTL 64, a per-NIC identification)/UDP (checksum 0) onto the link."""
        link = self._links[server * self.topology.k + level]
        total = 28 + len(udp_payload)
        ident = link.ident = (link.ident + 1) & 0xFFFF
        checksum = link.address_sum + total + ident
        checksum = (checksum & 0xFFFF) + (checksum >> 16)
        checksum = (checksum & 0xFFFF) + (checksum >> 16)
        frame = _FRAME_HEAD.pack(link.ethernet, 0x45, 0, total, ident, 0x4000, 64, 17,
                                 ~checksum & 0xFFFF, link.addresses, src_port, BML_UDP_PORT,
                                 total - 20, 0) + udp_payload
        if link.corrupt:
            frame = self._corrupted(link, frame)
        self._send(link.up, link, frame, self._at_switch)

    def _corrupted(self, link: _Link, frame: bytes) -> bytes:
        """1-3 bytes flipped in the Ethernet, IPv4 and UDP headers (the first 42 bytes).

        Garbled addressing is what the switch must drop or route harmlessly. Bits flipped in
        the BML header or the values are out of scope: on a real link the Ethernet FCS drops
        such a frame (which ``loss`` models), and the P4 pipeline has no checksum of its own
        to catch one that got past it."""
        link.corrupt -= 1
        data, rng = bytearray(frame), self.rng
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(min(len(data), 42))] ^= rng.randrange(1, 256)
        return bytes(data)

    def _send(self, direction: LinkDirection, link: _Link, frame: bytes,
              arrive: Callable[[_Link, bytes, int], None]) -> None:
        clock, shape = self.clock, self.shape
        now = clock.now
        if not link.is_up:
            direction.down += 1
            return self._note(DOWN, link)
        start = direction.busy_until
        if start < now:
            start = now
        elif (start - now) * shape.rate >= 8 * shape.queue:
            direction.dropped += 1
            return self._note(DROPPED, link)
        size = len(frame)
        end = direction.busy_until = start + (size + WIRE_OVERHEAD) * 8 / shape.rate
        direction.frames += 1
        direction.bytes += size
        if shape.loss and self.rng.random() < shape.loss:
            direction.lost += 1
            return self._note(LOST, link)
        arrival = end + shape.delay
        if shape.reorder and self.rng.random() < shape.reorder:
            arrival += shape.reorder_delay
        clock._sequence += 1
        _heappush(clock._heap, (arrival, clock._sequence, arrive, (link, frame, link.epoch), None))

    def _at_switch(self, link: _Link, frame: bytes, epoch: int) -> None:
        if epoch != link.epoch:
            link.up.down += 1
            return self._note(DOWN, link)
        node = link.node
        if node.pipeline is None:
            link.up.dead += 1
            return self._note(DEAD, link)
        self._note(SWITCHED, link)
        ports = node.links
        for port, copy in node.pipeline.process(link.port, frame):
            target = ports[port] if 0 < port < len(ports) else None
            if target is None:
                link.up.rejected += 1
                continue
            self._send(target.down, target, copy, self._at_host)

    def _at_host(self, link: _Link, frame: bytes, epoch: int) -> None:
        if epoch != link.epoch:
            link.down.down += 1
            return self._note(DOWN, link)
        payload = _udp_payload(frame, link.mac, link.ip)
        if payload is None:
            link.down.rejected += 1
            return self._note(REJECTED, link)
        self._note(DELIVERED, link)
        self.deliver_frame(link.server, link.level, payload)

    # ------------------------------------------------------------ streams
    def route(self, src: int, dst: int, dim: int, detour: bool) -> list[tuple[int, int]]:
        """The links of the mesh connection between level-``dim`` neighbours: through their
        switch, or (it is broken) via their relays on the detour level."""
        if not detour:
            return [(src, dim), (dst, dim)]
        m = self.topology.detour_level(dim)
        relay_src, relay_dst = self.topology.relay(src, dim), self.topology.relay(dst, dim)
        return [(src, m), (relay_src, m), (relay_src, dim), (relay_dst, dim), (relay_dst, m),
                (dst, m)]

    def send_stream(self, hops: list[tuple[int, int]], size: int,
                    on_arrival: Callable[[], None], min_rto: float = MIN_RTO,
                    window: int | None = None) -> None:
        """A message of ``size`` bytes on the TCP connection along ``hops`` (pairs of links
        through a switch; a relay server forwards from one pair to the next, in no time).

        Cut into segments of SEGMENT_PAYLOAD bytes (+ SEGMENT_HEADERS on the wire), sent while
        the connection has under ``window`` bytes unacknowledged (an ACK returns the
        path's propagation delay after its segment arrived; ACKs take no link time). Segments
        share every FIFO with frames but are never tail-dropped. A switch forwards them
        without its pipeline (the l2 path, which the packet tests cover), but only alive and
        holding the next NIC's l2 entry. A lost segment is re-sent from the source as Linux's
        RACK does once a segment sent after it has arrived (its SACK back, a quarter of the
        round trip more), else after max(``min_rto``, 4 x the path's queueing) (a lone or
        last segment: the RTO); one that meets a down link or a switch that
        cannot forward is re-sent after ``min_rto``, doubling to MAX_BACKOFF, until the path
        is back. ``min_rto``: the connection's least retransmission timeout, as its sockets
        set it, and ``window``: the bytes the sender keeps unacknowledged on it, as it paces
        the connection (``hosts.mesh``; default ``stream_window``); both are fixed when the
        connection is made. ``on_arrival`` runs when the message's last segment is in, in
        order."""
        key = tuple(hops)
        connection = self._connections.get(key) or self._connect(
            key, min_rto, self.stream_window if window is None else window)
        count = max(1, -(-size // SEGMENT_PAYLOAD))
        for index in range(count):
            segment_size = min(SEGMENT_PAYLOAD, size - index * SEGMENT_PAYLOAD)
            connection.waiting.append(_Segment(connection.next_seq, segment_size,
                                               connection.min_rto))
            connection.next_seq += 1
        connection.messages.append((connection.next_seq - 1, on_arrival))
        connection.unacked += size
        self._pump(connection)

    def path_up(self, hops: list[tuple[int, int]]) -> bool:
        """Whether a connection along ``hops`` can be made now: every link up, every switch
        on it alive and forwarding to the next NIC (what a TCP handshake finds out)."""
        k = self.topology.k
        for server, level in hops:
            link = self._links[server * k + level]
            pipeline = link.node.pipeline
            if not link.is_up or pipeline is None or \
                    pipeline.tables.l2_forward.get(link.mac) != link.port:
                return False
        return True

    def handshake(self, hops: list[tuple[int, int]], on_arrival: Callable[..., None],
                  *args) -> None:
        """A connection's handshake segment (a SYN, its SYN-ACK, a RST) along ``hops``:
        ``on_arrival(*args)`` once it is in, after the path's delay and the queues ahead of
        it on every link. Lost if the path cannot carry it as it leaves or as it arrives
        (``path_up``: a link or switch that fails under it), or by the links' loss, drawn
        per link as a frame's is. It takes no link time and holds no queue."""
        if not self.path_up(hops):
            return
        shape, k, now = self.shape, self.topology.k, self.clock.now
        if shape.loss and any(self.rng.random() < shape.loss for _ in hops):
            return
        links = [self._links[server * k + level] for server, level in hops]
        took = 0.0
        for index, link in enumerate(links):
            direction = link.down if index % 2 else link.up
            took += max(0.0, direction.busy_until - now - took) + shape.delay
        self.clock.after(took, self._handshake_arrives, hops, links,
                         [link.epoch for link in links], on_arrival, args)

    def _handshake_arrives(self, hops: list[tuple[int, int]], links: list[_Link],
                           epochs: list[int], on_arrival: Callable[..., None],
                           args: tuple) -> None:
        if self.path_up(hops) and epochs == [link.epoch for link in links]:
            on_arrival(*args)

    def queued(self, hops: list[tuple[int, int]]) -> bool:
        """Whether bytes handed to the connection along ``hops`` still wait outside its window
        (a paced socket's outbox, ``hosts.mesh.Peer.outbox``)."""
        connection = self._connections.get(tuple(hops))
        return bool(connection and connection.waiting)

    def unacked(self, hops: list[tuple[int, int]]) -> int:
        """Bytes handed to the connection along ``hops`` and not yet acknowledged (SIOCOUTQ)."""
        connection = self._connections.get(tuple(hops))
        return connection.unacked if connection else 0

    def _connect(self, hops: tuple[tuple[int, int], ...], min_rto: float,
                 window: int) -> _Connection:
        if len(hops) < 2 or len(hops) % 2:
            raise ValueError(f"stream hops {hops}: pairs of links through a switch expected")
        k = self.topology.k
        links = [self._links[server * k + level] for server, level in hops]
        for i in range(0, len(links), 2):
            if links[i].node is not links[i + 1].node or links[i].server == links[i + 1].server:
                raise ValueError(f"stream hops {hops}: {hops[i]} and {hops[i + 1]} are not two "
                                 "servers' links to one switch")
            if i and links[i].server != links[i - 1].server:
                raise ValueError(f"stream hops {hops}: {hops[i - 1]} and {hops[i]} are not one "
                                 "relay server's links")
        path = [(link, link.down if i % 2 else link.up) for i, link in enumerate(links)]
        connection = self._connections[hops] = _Connection(path, len(path) * self.shape.delay,
                                                           min_rto, window)
        return connection

    def _pump(self, connection: _Connection) -> None:
        waiting = connection.waiting
        while waiting and (connection.in_flight == 0
                           or connection.in_flight + waiting[0].size <= connection.window):
            segment = waiting.popleft()
            connection.in_flight += segment.size
            self._enter(connection, segment, 0)

    def _enter(self, connection: _Connection, segment: _Segment, hop: int) -> None:
        link, direction = connection.path[hop]
        if not hop:
            segment.sent = self.clock.now
        if hop % 2:  # at the switch
            pipeline = link.node.pipeline
            if pipeline is None:
                connection.path[hop - 1][1].dead += 1
                return self._stall(connection, segment, DEAD, link)
            if pipeline.tables.l2_forward.get(link.mac) != link.port:
                connection.path[hop - 1][1].rejected += 1
                return self._stall(connection, segment, REJECTED, link)
        if not link.is_up:
            direction.down += 1
            return self._stall(connection, segment, DOWN, link)
        now, shape = self.clock.now, self.shape
        start = direction.busy_until if direction.busy_until > now else now
        wire = segment.size + SEGMENT_HEADERS
        end = direction.busy_until = start + (wire + WIRE_OVERHEAD) * 8 / shape.rate
        direction.frames += 1
        direction.bytes += wire
        if shape.loss and self.rng.random() < shape.loss:
            direction.lost += 1
            self._note(LOST, link)
            queueing = sum(max(0.0, d.busy_until - now) for _, d in connection.path)
            connection.lost[segment.seq] = segment
            self.clock._push(now + max(connection.min_rto, 4 * queueing), self._retransmit,
                             (connection, segment, segment.attempt))
            return None
        arrival = end + shape.delay
        if shape.reorder and self.rng.random() < shape.reorder:
            arrival += shape.reorder_delay
        self.clock._push(arrival, self._segment_arrives, (connection, segment, hop, link.epoch))
        return None

    def _retransmit(self, connection: _Connection, segment: _Segment, attempt: int) -> None:
        """Re-send a lost segment, unless its other timer (RACK's or the RTO) did first."""
        if segment.attempt != attempt:
            return
        segment.attempt += 1
        connection.lost.pop(segment.seq, None)
        self._enter(connection, segment, 0)

    def _stall(self, connection: _Connection, segment: _Segment, kind: int,
               link: _Link) -> None:
        self._note(kind, link)
        self.clock._push(self.clock.now + segment.backoff, self._enter, (connection, segment, 0))
        segment.backoff = min(2 * segment.backoff, MAX_BACKOFF)

    def _segment_arrives(self, connection: _Connection, segment: _Segment, hop: int,
                         epoch: int) -> None:
        link, direction = connection.path[hop]
        if epoch != link.epoch:
            direction.down += 1
            return self._stall(connection, segment, DOWN, link)
        if hop + 1 < len(connection.path):
            return self._enter(connection, segment, hop + 1)
        self._note(SEGMENT, link)
        now = self.clock.now
        self.clock._push(now + connection.ack_delay, self._acked, (connection, segment.size))
        if connection.lost:
            # RACK: the SACK of a segment sent after a lost one returns, and a quarter of the
            # round trip later (its reordering window) the lost one is re-sent. "After": later,
            # or at the same time with a higher sequence number (RACK's rule).
            rack, after = now + 1.5 * connection.ack_delay, (segment.sent, segment.seq)
            for seq in [seq for seq, lost in connection.lost.items()
                        if (lost.sent, seq) < after]:
                lost = connection.lost.pop(seq)
                self.clock._push(rack, self._retransmit, (connection, lost, lost.attempt))
        if segment.seq != connection.expected:
            connection.early.add(segment.seq)
            return None
        expected, early = segment.seq + 1, connection.early
        while expected in early:
            early.remove(expected)
            expected += 1
        connection.expected = expected
        messages = connection.messages
        while messages and messages[0][0] < expected:
            self._note(MESSAGE, link)
            messages.popleft()[1]()
        return None

    def _acked(self, connection: _Connection, size: int) -> None:
        connection.in_flight -= size
        connection.unacked -= size
        self._pump(connection)

    # ------------------------------------------------------------ faults
    def _cut(self, link: _Link) -> None:
        """What is on the link or queued for it is lost."""
        link.epoch += 1
        now = self.clock.now
        for direction in (link.up, link.down):
            direction.busy_until = min(direction.busy_until, now)

    def kill_switch(self, name: str) -> None:
        node = self._nodes[name]
        node.pipeline = None
        for link in node.links[1:]:
            self._cut(link)

    def restore_switch(self, name: str) -> None:
        """Power on again: registers at zero, tables empty, until provisioned."""
        self._nodes[name].pipeline = Pipeline(lanes=self.wire.lanes)

    def set_link(self, server: int, level: int, up: bool) -> None:
        link = self._links[server * self.topology.k + level]
        if link.is_up and not up:
            self._cut(link)
        link.is_up = up

    def corrupt_next(self, server: int, level: int, count: int = 1) -> None:
        """Flip bytes of the next ``count`` frames this NIC sends (not stream segments: TCP's
        checksum would discard those, which ``loss`` models)."""
        self._links[server * self.topology.k + level].corrupt += count

    # ------------------------------------------------------------ observation
    def pipeline(self, name: str) -> Pipeline | None:
        return self._nodes[name].pipeline

    def bytes_per_nic(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(server, level) -> (bytes sent, bytes received) on the wire, every header counted."""
        return {(link.server, link.level): (link.up.bytes, link.down.bytes)
                for link in self._links}

    def trace_hash(self) -> int:
        """A running hash of (time, kind, link) of everything that happened to a frame or a
        segment: equal for equal runs."""
        return self._trace


def _udp_payload(frame: bytes, mac: bytes, ip: bytes) -> bytes | None:
    """The UDP payload of a frame the host's stack accepts on the NIC (mac, ip), else None."""
    if (len(frame) < 42 or frame[0:6] != mac or frame[12:14] != b"\x08\x00"
            or frame[14] != 0x45 or frame[23] != 17 or frame[30:34] != ip
            or (frame[20] & 0x3F) or frame[21]):
        return None
    if sum(_IPV4_WORDS.unpack_from(frame, 14)) % 0xFFFF:
        return None  # the one's-complement sum of a valid header is 0xFFFF
    total = frame[16] << 8 | frame[17]
    udp_length = frame[38] << 8 | frame[39]
    if not 28 <= total <= len(frame) - 14 or not 8 <= udp_length <= total - 20:
        return None
    if (frame[40] or frame[41]) and not _udp_checksum_ok(frame[26:34], frame[34:34 + udp_length]):
        return None
    return frame[42:34 + udp_length]


def _udp_checksum_ok(addresses: bytes, datagram: bytes) -> bool:
    data = addresses + b"\x00\x11" + len(datagram).to_bytes(2, "big") + datagram
    if len(data) % 2:
        data += b"\x00"
    return sum(struct.unpack(f"!{len(data) // 2}H", data)) % 0xFFFF == 0
