"""Link-bound cost model of gradient synchronisation time (GST) on one switch (star).

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

from bml.protocol import FRAME_BYTES, VALUES_BYTES, VALUES_PER_PACKET

TCP_IP_ETH_OVERHEAD = 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps


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
