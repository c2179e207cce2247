"""Link-bound cost model of gradient synchronisation time (GST).

On one switch (star):

With every link shaped to ``rate`` bits/s in each direction and the switch not the bottleneck,
a scheme's GST is the busiest NIC's bytes in one direction over the rate:

* in-network aggregation (SwitchML-style): every worker sends its gradient once and receives
  the sum once, in packets of ``wire.frame_bytes`` carrying ``wire.values_bytes`` of
  gradient, up and down pipelined: GST = S * frame_bytes / values_bytes * 8 / rate.
* ring allreduce (gloo): reduce-scatter then all-gather, each worker sends 2 (N-1)/N * S
  (TCP/IP overhead per ``mtu`` packet added): GST = 2 (N-1)/N * S * overhead * 8 / rate.

So at N = 4 in-network needs 1/1.5 = 2/3 of ring's bytes of payload (about 1/2 for large N);
per wire byte the ratio is (314/256) / (1.5 * 1.006), about 0.81, with 64 values per packet,
and (8890/8832) / (1.5 * 1.006), about 0.67, with 2,208. Every packet-level function takes the
lane width (``wire``, a ``bml.protocol.Wire``): a block is one packet's values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from bml.protocol import (
    DEFAULT_WIRE,
    HEADER_ONLY_FRAME_BYTES,
    ONE_NIC_WINDOW,
    Wire,
)
from bml.schedule import (
    DEFAULT_WINDOW,
    HOST_BASED,
    IN_NETWORK,
    MESSAGE_BLOCKS,
    MESSAGE_HEADER_BYTES,
    MIXED,
    Layout,
    NicTraffic,
    Schedule,
    make_schedule,
    traffic,
)
from bml.topology import Topology

TCP_IP_ETH_OVERHEAD = 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def rate_bits(rate: str) -> int:
    """``100mbit`` -> 100_000_000 (tc's decimal units)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)", rate.strip().lower())
    if not match:
        raise ValueError(f"bad rate {rate!r}: use a number and bit, kbit, mbit or gbit "
                         "(e.g. 100mbit)")
    return int(float(match.group(1)) * _RATE_UNITS[match.group(2)])


def in_network_wire_bytes(elements: int, wire: Wire = DEFAULT_WIRE) -> int:
    """Bytes one worker's NIC sends (and receives) for one aggregation of ``elements``."""
    return wire.chunks(elements) * wire.frame_bytes


def in_network_gst(elements: int, rate_bps: float, wire: Wire = DEFAULT_WIRE) -> float:
    return in_network_wire_bytes(elements, wire) * 8 / rate_bps


def ring_wire_bytes(elements: int, workers: int, mtu: int = 9000) -> float:
    payload = 2 * (workers - 1) / workers * 4 * elements
    per_packet = mtu - 20 - 32
    return payload * (per_packet + TCP_IP_ETH_OVERHEAD) / per_packet


def ring_gst(elements: int, workers: int, rate_bps: float, mtu: int = 9000) -> float:
    return ring_wire_bytes(elements, workers, mtu) * 8 / rate_bps


def payload_share(wire: Wire = DEFAULT_WIRE) -> float:
    return wire.values_bytes / wire.frame_bytes


# --- schedules on a BCube (or a star): per-NIC wire bytes and GST -------------------------

ACK_FRAME_BYTES = HEADER_ONLY_FRAME_BYTES  # a header-only aggregation frame
DEFAULT_MTU = 9000  # what bml-net sets on every link


def tcp_segment_payload(mtu: int = DEFAULT_MTU) -> int:
    return mtu - 20 - 32


def tcp_wire(payload: int, mtu: int = DEFAULT_MTU) -> tuple[float, float]:
    """(bytes on the sending side's link, bytes of ACKs coming back) for ``payload`` bytes of
    TCP: a 66-byte Ethernet/IPv4/TCP header per full segment, one delayed ACK per two."""
    segments = payload / tcp_segment_payload(mtu)
    return payload + segments * TCP_IP_ETH_OVERHEAD, segments / 2 * TCP_IP_ETH_OVERHEAD


def nic_wire_bytes(nic: NicTraffic, mtu: int = DEFAULT_MTU,
                   wire: Wire = DEFAULT_WIRE) -> tuple[float, float]:
    """(up, down) bytes on one NIC's link, every header counted."""
    block = wire.values_bytes
    sent, acks_back = tcp_wire(nic.up.stream_blocks * block + nic.up.stream_overhead, mtu)
    received, acks_out = tcp_wire(nic.down.stream_blocks * block + nic.down.stream_overhead,
                                  mtu)
    frame = wire.frame_bytes
    up = nic.up.frames * frame + nic.up.acks * ACK_FRAME_BYTES + sent + acks_out
    down = nic.down.frames * frame + nic.down.acks * ACK_FRAME_BYTES + received + acks_back
    return up, down


class LinkBound:
    """What follows from bytes per NIC (``nic_bytes[server][nic] = (up, down)``) on links of
    ``rate_bps`` each way: GST is the busier direction of the busiest NIC over the rate, plus
    ``serial_bytes`` that cannot overlap it (a pipeline's fill and drain)."""

    nic_bytes: tuple[tuple[tuple[float, float], ...], ...]
    rate_bps: float
    serial_bytes: float = 0.0

    @property
    def busiest(self) -> float:
        return max(max(up, down) for server in self.nic_bytes for up, down in server)

    @property
    def gst(self) -> float:
        return (self.busiest + self.serial_bytes) * 8 / self.rate_bps

    @property
    def max_up(self) -> float:
        return max(up for server in self.nic_bytes for up, _ in server)

    @property
    def max_down(self) -> float:
        return max(down for server in self.nic_bytes for _, down in server)


@dataclass(frozen=True)
class Prediction(LinkBound):
    """A schedule's predicted wire bytes per server and NIC, and its GST on links of
    ``rate_bps`` each way: the busier direction of the busiest NIC over the rate."""

    schedule: Schedule
    elements: int
    rate_bps: float
    nic_bytes: tuple[tuple[tuple[float, float], ...], ...]  # [server][level] = (up, down)
    lanes: int = DEFAULT_WIRE.lanes


def predict(schedule: Schedule, elements: int, rate_bps: float, window: int = DEFAULT_WINDOW,
            mtu: int = DEFAULT_MTU, wire: Wire = DEFAULT_WIRE) -> Prediction:
    layout = Layout(schedule, wire.chunks(elements))
    per_server = tuple(
        tuple(nic_wire_bytes(nic, mtu, wire) for nic in traffic(layout, server, window))
        for server in range(schedule.topology.num_servers))
    return Prediction(schedule, elements, rate_bps, per_server, wire.lanes)


def candidates(topology: Topology) -> list[Schedule]:
    """Every schedule the planner weighs on ``topology`` (mixed needs k >= 2)."""
    names = [IN_NETWORK, HOST_BASED] + ([MIXED] if topology.k >= 2 else [])
    return [make_schedule(topology, name) for name in names]


def plan(topology: Topology, elements: int, rate_bps: float,
         wire: Wire = DEFAULT_WIRE) -> list[Prediction]:
    """Every candidate's prediction at the lane width, fastest first (on a tie, in the order
    of ``candidates``)."""
    predictions = [predict(s, elements, rate_bps, wire=wire) for s in candidates(topology)]
    return sorted(predictions, key=lambda p: round(p.gst, 9))


def choose(topology: Topology, elements: int, rate_bps: float = 10e6,
           wire: Wire = DEFAULT_WIRE) -> Schedule:
    """The schedule the cost model predicts fastest at the lane width."""
    return plan(topology, elements, rate_bps, wire)[0].schedule


# --- every scheme on the same links: baselines, BCube schedules, switch counts -------------
#
# The seed's claims compare schemes on the same servers and link rate. A scheme's prediction
# is its wire bytes per NIC and direction (every header and ACK counted) and its GST, the
# busier direction of the busiest NIC over the rate. The baselines run over TCP on a star of
# N servers, one NIC each (a Fat-Tree with full bisection behaves alike: a server's NIC is the
# bottleneck):
#
# * PS sharded over all N servers: server i holds shard i (1/N); each worker pushes shard j to
#   server j and gets its sum back, so a NIC sends (N-1)/N G of pushes plus (N-1)/N G of sums
#   and receives as much: 2 (N-1)/N G each way.
# * dedicated PS, P servers apart from the W workers: a worker sends G and receives G; a PS
#   server receives W G / P and sends as much, so it is the bottleneck when W > P.
# * ring allreduce (gloo): reduce-scatter then all-gather, 2 (N-1)/N G each way.
# * single-switch in-network (SwitchML-style, star:N): G each way in 314-byte frames.

PS = "ps"
PS_DEDICATED = "ps-dedicated"
RING = "ring"
SINGLE_SWITCH = "single-switch"
PS_HEADER_BYTES = 12  # baselines/ps.py message header: kind, shard, offset, count
PS_CHUNK_VALUES = 1 << 12  # float32 values per PS message (16 KiB: a holder sums a chunk once
# all W contributions are in, so a smaller chunk fills and drains the pipeline sooner)
TCP_ACK_SEGMENTS = 2  # a delayed ACK per this many full segments


@dataclass(frozen=True)
class WirePrediction(LinkBound):
    """Any scheme's predicted bytes per NIC (``[server][nic] = (up, down)``), its GST on links
    of ``rate_bps`` each way, and the switches its topology needs."""

    scheme: str
    elements: int
    rate_bps: float
    nic_bytes: tuple[tuple[tuple[float, float], ...], ...]
    switches: int
    serial_bytes: float = 0.0


def tcp_nic_bytes(sent: float, received: float, mtu: int = DEFAULT_MTU) -> tuple[float, float]:
    """(up, down) wire bytes of a NIC that sends ``sent`` and receives ``received`` TCP payload
    bytes: segment headers, and each direction's ACKs in the other."""
    out, acks_back = tcp_wire(sent, mtu)
    into, acks_out = tcp_wire(received, mtu)
    return out + acks_out, into + acks_back


def shard_sizes(elements: int, shards: int) -> list[int]:
    """Values per PS shard: contiguous ranges, the first ``elements % shards`` one longer
    (``bml.schedule.split``, as baselines/ps.py cuts them)."""
    size, extra = divmod(elements, shards)
    return [size + (1 if i < extra else 0) for i in range(shards)]


def ps_message_bytes(values: int) -> int:
    """TCP payload bytes of ``values`` float32 sent as PS messages of at most
    ``PS_CHUNK_VALUES`` values, each with its header."""
    messages = -(-values // PS_CHUNK_VALUES) if values else 0
    return 4 * values + messages * PS_HEADER_BYTES


def predict_ps(elements: int, workers: int, rate_bps: float, servers: int | None = None,
               mtu: int = DEFAULT_MTU) -> WirePrediction:
    """PS on a star: ``servers=None`` shards it over the ``workers`` themselves (server i is
    worker i); else ``servers`` dedicated PS hosts after the workers (star of W + P)."""
    if servers is None:
        sizes = shard_sizes(elements, workers)
        nics = []
        for i in range(workers):
            pushed = sum(ps_message_bytes(s) for j, s in enumerate(sizes) if j != i)
            summed = (workers - 1) * ps_message_bytes(sizes[i])
            nics.append((tcp_nic_bytes(pushed + summed, pushed + summed, mtu),))
        return WirePrediction(PS, elements, rate_bps, tuple(nics), 1)
    sizes = shard_sizes(elements, servers)
    whole = sum(ps_message_bytes(s) for s in sizes)
    nics = [(tcp_nic_bytes(whole, whole, mtu),) for _ in range(workers)]
    nics += [(tcp_nic_bytes(workers * ps_message_bytes(s), workers * ps_message_bytes(s),
                            mtu),) for s in sizes]
    # A PS host sends a chunk's sum only once all W contributions to it are in: its sending
    # starts a chunk from every worker after its receiving (fill), and the last chunk's W
    # sums leave after the last contribution came (drain): W messages that overlap nothing.
    chunk = min(PS_CHUNK_VALUES, max(sizes))
    serial = workers * tcp_wire(ps_message_bytes(chunk), mtu)[0]
    return WirePrediction(PS_DEDICATED, elements, rate_bps, tuple(nics), 1, serial)


def predict_ring(elements: int, workers: int, rate_bps: float,
                 mtu: int = DEFAULT_MTU) -> WirePrediction:
    """gloo's ring allreduce on a star: 2 (N-1)/N of the gradient each way per NIC."""
    payload = 2 * (workers - 1) / workers * 4 * elements
    nic = (tcp_nic_bytes(payload, payload, mtu),)
    return WirePrediction(RING, elements, rate_bps, tuple(nic for _ in range(workers)), 1)


def predict_schedule(schedule: Schedule, elements: int, rate_bps: float,
                     window: int = DEFAULT_WINDOW, mtu: int = DEFAULT_MTU,
                     wire: Wire = DEFAULT_WIRE) -> WirePrediction:
    """A BCube (or star) schedule's ``predict`` as a WirePrediction; on a star the in-network
    schedule is single-switch aggregation."""
    p = predict(schedule, elements, rate_bps, window, mtu, wire)
    topo = schedule.topology
    name = SINGLE_SWITCH if topo.k == 1 and schedule.name == IN_NETWORK else schedule.name
    return WirePrediction(name, elements, rate_bps, p.nic_bytes, topo.num_switches)


# --- closed forms for BCubes too large to enumerate, and the Fat-Tree they are weighed against

@dataclass(frozen=True)
class NicLoad:
    """The busiest NIC's load per direction in units of a stripe S = G / k: aggregation frames'
    payload, header-only ACK frames (one per block), TCP payload."""

    up_frames: Fraction = Fraction(0)
    down_frames: Fraction = Fraction(0)
    down_acks: Fraction = Fraction(0)
    up_stream: Fraction = Fraction(0)
    down_stream: Fraction = Fraction(0)

    @property
    def up(self) -> Fraction:
        return self.up_frames + self.up_stream

    @property
    def down(self) -> Fraction:
        return self.down_frames + self.down_stream

    def wire(self, mtu: int = DEFAULT_MTU, lanes: Wire = DEFAULT_WIRE) -> tuple[float, float]:
        """(up, down) wire bytes per payload byte of a stripe: a frame's bytes per block's
        (314 per 256 at 64 lanes), an ACK frame's 58 per block, TCP segment headers and ACKs,
        host messages' 16-byte headers."""
        frame = lanes.frame_bytes / lanes.values_bytes
        ack = ACK_FRAME_BYTES / lanes.values_bytes
        message = 1 + MESSAGE_HEADER_BYTES / (MESSAGE_BLOCKS * lanes.values_bytes)
        segment = tcp_segment_payload(mtu)
        tcp = 1 + TCP_IP_ETH_OVERHEAD / segment
        tcp_ack = TCP_IP_ETH_OVERHEAD / TCP_ACK_SEGMENTS / segment
        up_stream, down_stream = float(self.up_stream) * message, float(self.down_stream) * message
        up = float(self.up_frames) * frame + up_stream * tcp + down_stream * tcp_ack
        down = (float(self.down_frames) * frame + float(self.down_acks) * ack
                + down_stream * tcp + up_stream * tcp_ack)
        return up, down


def bcube_load(n: int, k: int, scheme: str, alpha: Fraction | None = None) -> NicLoad:
    """The busiest NIC's load of a schedule on BCube(n, k) in closed form (every NIC carries
    the same by symmetry when the blocks divide evenly), for any n and k; tests check it
    against ``bml.schedule.traffic`` where the topology can be enumerated.

    With T = sum_{j=1}^{k-1} n^-j: host-based sends and receives (n-1)/n of a piece at each
    of k reduce-scatters and k all-gathers, 2 (1 - n^-k) in all. In-network sends the piece
    up at each RS (1 + ... + n^-(k-2)), the last piece at the AR (n^-(k-1)) and its own part
    at each AG (T): up 1 + 2T; receives its part at each RS (T) with an ACK frame for the
    rest (1 - n^-(k-1)), the AR's sum (n^-(k-1)) and the others' parts at each AG
    (1 - n^-(k-1)): down 1 + T. Mixed moves a share 1 - a of the first RS to the hosts."""
    third = Fraction(1, n)
    tail = sum(third ** j for j in range(1, k))
    if scheme == HOST_BASED:
        each = 2 * (1 - third ** k)
        return NicLoad(up_stream=each, down_stream=each)
    if scheme == IN_NETWORK:
        a = Fraction(1)
    elif scheme == MIXED:
        if alpha is None:
            a = 1 - tail * n / (n - 1)
            a = min(Fraction(1), max(Fraction(0), a))
        else:
            a = Fraction(alpha)
    else:
        raise ValueError(f"unknown schedule {scheme!r}")
    host = 1 - a  # share of the first RS that goes host to host
    acks = 1 - third ** (k - 1) - host * (1 - third)  # RS chunks the NIC does not own
    return NicLoad(up_frames=1 + 2 * tail - host, down_frames=1 + tail - host * third,
                   down_acks=acks,
                   up_stream=host * (n - 1) / n, down_stream=host * (n - 1) / n)


def baseline_load(workers: int) -> Fraction:
    """Payload per NIC and direction of PS sharded over all N servers and of ring allreduce,
    in units of the gradient G: 2 (N-1)/N."""
    return Fraction(2 * (workers - 1), workers)


def bcube_switches(n: int, k: int) -> int:
    """BCube(n, k): k levels of n^(k-1) switches of n ports."""
    return k * n ** (k - 1)


def fat_tree(servers: int, ports: int) -> tuple[int, int] | None:
    """(layers, switches) of the smallest full-bisection Fat-Tree (folded Clos) of
    ``ports``-port switches for ``servers`` servers, or None when none holds them.

    Below the top, every layer's switches use d = ports // 2 ports down and d up, so a layer
    has ceil(N / d) of them; the top layer uses all ports down, ceil(N / ports). L layers hold
    ports * d^(L-1) servers: n^3/4 with 5 n^2/4 switches at L = 3 (the canonical k-ary
    Fat-Tree). With d = 1 (2- or 3-port switches) no tree grows beyond one switch."""
    if servers <= ports:
        return 1, 1
    d = ports // 2
    if d < 2:
        return None
    layers, capacity = 1, ports
    while capacity < servers:
        layers += 1
        capacity *= d
    return layers, (layers - 1) * -(-servers // d) + -(-servers // ports)


@dataclass(frozen=True)
class ClaimRow:
    """One BCube(n, k) against PS on a Fat-Tree of n-port switches with the same N servers."""

    n: int
    k: int
    bcube_switches: int
    fat_tree: tuple[int, int] | None
    gst_ratio: dict[str, float]  # schedule -> BML GST / PS GST, wire bytes
    payload_ratio: dict[str, float]  # the same, payload only (DESIGN.md's units)

    @property
    def servers(self) -> int:
        return self.n ** self.k

    @property
    def switch_ratio(self) -> float | None:
        return None if self.fat_tree is None else self.bcube_switches / self.fat_tree[1]


def claim_row(n: int, k: int, mtu: int = DEFAULT_MTU, wire: Wire = DEFAULT_WIRE) -> ClaimRow:
    """GST ratios of every BML schedule on BCube(n, k) to a sharded PS on a Fat-Tree of the
    same N (same link rate; GST of each is its busiest NIC's busier direction), and both
    topologies' switch counts. The seed claims 1/k and k/5."""
    servers = n ** k
    ps_payload = baseline_load(servers)
    ps_wire = tcp_nic_bytes(float(ps_payload), float(ps_payload), mtu)
    ps_busiest = max(ps_wire)
    gst, payload = {}, {}
    for scheme in (HOST_BASED, IN_NETWORK, MIXED):
        load = bcube_load(n, k, scheme)
        # per NIC, a stripe is G / k, and all k NICs run at once
        gst[scheme] = max(load.wire(mtu, wire)) / k / ps_busiest
        payload[scheme] = float(max(load.up, load.down) / k / ps_payload)
    return ClaimRow(n, k, bcube_switches(n, k), fat_tree(servers, n), gst, payload)


def claim_table(smallest: int = 9, largest: int = 4096) -> list[ClaimRow]:
    """Every BCube(n, k), k >= 2, whose N = n^k lies in [smallest, largest], by N then k."""
    rows = []
    for k in range(2, largest.bit_length()):
        n = 2
        while n ** k <= largest:
            if n ** k >= smallest:
                rows.append(claim_row(n, k))
            n += 1
    return sorted(rows, key=lambda r: (r.servers, r.k))


def single_switch_frames(elements: int, window: int = ONE_NIC_WINDOW,
                         wire: Wire = DEFAULT_WIRE) -> int:
    """Frames one worker sends (and receives) in one call of the one-NIC transport
    (hosts/transport.py): a priming use of every slot, one use per chunk, and a zero flush
    where a slot would end on an odd number of uses."""
    chunks = wire.chunks(elements)
    window = min(window, chunks)
    uses = (1 + -(-(chunks - s) // window) for s in range(window))
    return sum(u + (u & 1) for u in uses)


def predict_single_switch(elements: int, workers: int, rate_bps: float,
                          window: int = ONE_NIC_WINDOW,
                          wire: Wire = DEFAULT_WIRE) -> WirePrediction:
    """SwitchML-style aggregation on star:N with one NIC per worker: every frame up comes
    back down as the slot's sum (multicast)."""
    size = single_switch_frames(elements, window, wire) * wire.frame_bytes
    nic = ((float(size), float(size)),)
    return WirePrediction(SINGLE_SWITCH, elements, rate_bps, tuple(nic for _ in range(workers)),
                          1)
