"""Link-bound cost model of gradient synchronisation time (GST).

On one switch (star):

With every link shaped to ``rate`` bits/s in each direction and the switch not the bottleneck,
a scheme's GST is the busiest NIC's bytes in one direction over the rate:

* in-network aggregation (SwitchML-style): every worker sends its gradient once and receives
  the sum once, in packets of ``FRAME_BYTES`` carrying ``VALUES_BYTES`` of gradient, up and
  down pipelined: GST = S * FRAME_BYTES / VALUES_BYTES * 8 / rate.
* ring allreduce (gloo): reduce-scatter then all-gather, each worker sends 2 (N-1)/N * S
  (TCP/IP overhead per ``mtu`` packet added): GST = 2 (N-1)/N * S * overhead * 8 / rate.

So at N = 4 in-network needs 1/1.5 = 2/3 of ring's bytes of payload (about 1/2 for large N);
per wire byte the ratio is (314/256) / (1.5 * 1.006), about 0.81, with 64 values per packet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bml.protocol import (
    ETH_IP_UDP_BYTES,
    FRAME_BYTES,
    HEADER_BYTES,
    VALUES_BYTES,
    VALUES_PER_PACKET,
)
from bml.schedule import (
    DEFAULT_WINDOW,
    HOST_BASED,
    IN_NETWORK,
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


def in_network_wire_bytes(elements: int) -> int:
    """Bytes one worker's NIC sends (and receives) for one aggregation of ``elements``."""
    packets = -(-elements // VALUES_PER_PACKET)
    return packets * FRAME_BYTES


def in_network_gst(elements: int, rate_bps: float) -> float:
    return in_network_wire_bytes(elements) * 8 / rate_bps


def ring_wire_bytes(elements: int, workers: int, mtu: int = 9000) -> float:
    payload = 2 * (workers - 1) / workers * 4 * elements
    per_packet = mtu - 20 - 32
    return payload * (per_packet + TCP_IP_ETH_OVERHEAD) / per_packet


def ring_gst(elements: int, workers: int, rate_bps: float, mtu: int = 9000) -> float:
    return ring_wire_bytes(elements, workers, mtu) * 8 / rate_bps


def payload_share() -> float:
    return VALUES_BYTES / FRAME_BYTES


# --- schedules on a BCube (or a star): per-NIC wire bytes and GST -------------------------

ACK_FRAME_BYTES = ETH_IP_UDP_BYTES + HEADER_BYTES  # a header-only aggregation frame
DEFAULT_MTU = 9000  # what bml-net sets on every link


def tcp_segment_payload(mtu: int = DEFAULT_MTU) -> int:
    return mtu - 20 - 32


def tcp_wire(payload: int, mtu: int = DEFAULT_MTU) -> tuple[float, float]:
    """(bytes on the sending side's link, bytes of ACKs coming back) for ``payload`` bytes of
    TCP: a 66-byte Ethernet/IPv4/TCP header per full segment, one delayed ACK per two."""
    segments = payload / tcp_segment_payload(mtu)
    return payload + segments * TCP_IP_ETH_OVERHEAD, segments / 2 * TCP_IP_ETH_OVERHEAD


def nic_wire_bytes(nic: NicTraffic, mtu: int = DEFAULT_MTU) -> tuple[float, float]:
    """(up, down) bytes on one NIC's link, every header counted."""
    sent, acks_back = tcp_wire(nic.up.stream + nic.up.stream_overhead, mtu)
    received, acks_out = tcp_wire(nic.down.stream + nic.down.stream_overhead, mtu)
    up = nic.up.frames * FRAME_BYTES + nic.up.acks * ACK_FRAME_BYTES + sent + acks_out
    down = nic.down.frames * FRAME_BYTES + nic.down.acks * ACK_FRAME_BYTES + received + acks_back
    return up, down


@dataclass(frozen=True)
class Prediction:
    """A schedule's predicted wire bytes per server and NIC, and its GST on links of
    ``rate_bps`` each way: the busier direction of the busiest NIC over the rate."""

    schedule: Schedule
    elements: int
    rate_bps: float
    nic_bytes: tuple[tuple[tuple[float, float], ...], ...]  # [server][level] = (up, down)

    @property
    def busiest(self) -> float:
        return max(max(up, down) for server in self.nic_bytes for up, down in server)

    @property
    def gst(self) -> float:
        return self.busiest * 8 / self.rate_bps

    @property
    def max_up(self) -> float:
        return max(up for server in self.nic_bytes for up, _ in server)

    @property
    def max_down(self) -> float:
        return max(down for server in self.nic_bytes for _, down in server)


def blocks_of(elements: int) -> int:
    return max(1, -(-elements // VALUES_PER_PACKET))


def predict(schedule: Schedule, elements: int, rate_bps: float, window: int = DEFAULT_WINDOW,
            mtu: int = DEFAULT_MTU) -> Prediction:
    layout = Layout(schedule, blocks_of(elements))
    per_server = tuple(
        tuple(nic_wire_bytes(nic, mtu) for nic in traffic(layout, server, window))
        for server in range(schedule.topology.num_servers))
    return Prediction(schedule, elements, rate_bps, per_server)


def candidates(topology: Topology) -> list[Schedule]:
    """Every schedule the planner weighs on ``topology`` (mixed needs k >= 2)."""
    names = [IN_NETWORK, HOST_BASED] + ([MIXED] if topology.k >= 2 else [])
    return [make_schedule(topology, name) for name in names]


def plan(topology: Topology, elements: int, rate_bps: float) -> list[Prediction]:
    """Every candidate's prediction, fastest first (on a tie, in the order of
    ``candidates``)."""
    predictions = [predict(s, elements, rate_bps) for s in candidates(topology)]
    return sorted(predictions, key=lambda p: round(p.gst, 9))


def choose(topology: Topology, elements: int, rate_bps: float = 10e6) -> Schedule:
    """The schedule the cost model predicts fastest."""
    return plan(topology, elements, rate_bps)[0].schedule
