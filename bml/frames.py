"""Raw aggregation frames: Ethernet / IPv4 / UDP / BML as bytes, built and read without Scapy.

The one place the frame layout lives for the control plane (its RESET PacketOuts), the
benchmarks (pre-built traffic) and the tests (the differential oracle, hostile frames, the PTF
bench's addresses), so that a change to it is made once. ``bml.protocol`` has the BML header
(``HEADER_STRUCT``); this module puts the headers around it.

It also names the bench: a lone switch with one host per port, which the packet tests, the
differential test and the benchmarks all use. Port p's host is 02:00:00:00:00:pp / 10.0.0.p;
the switch is ``SWITCH_MAC`` / ``SWITCH_IP`` on every port. (The emulated topologies address
their switches and NICs by ``bml.topology`` instead.)
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

import numpy as np

from bml.protocol import (
    BML_UDP_PORT,
    DEFAULT_WIRE,
    ETH_IP_UDP_BYTES,
    EXPONENT_NONE,
    HEADER_BYTES,
    LANE_DTYPE,
    LANES_PER_BLOCK,
    PacketType,
    Wire,
    job_udp_port,
    pack_header,
    unpack_header,
)

# version/IHL, TOS, total length, identification, flags/fragment offset, TTL, protocol,
# checksum, source, destination: an IPv4 header without options
IPV4_STRUCT = struct.Struct("!BBHHHBBH4s4s")
UDP_STRUCT = struct.Struct("!HHHH")  # source port, destination port, length, checksum
ETHERTYPE_IPV4 = b"\x08\x00"
IP_START = 14  # offsets in an untagged frame whose IPv4 header has no options
UDP_START = 34
BML_START = ETH_IP_UDP_BYTES  # 42
UDP_PROTOCOL = 17

SWITCH_MAC = bytes.fromhex("02ff00000001")
SWITCH_IP = bytes([10, 0, 255, 1])


def host_mac(port: int) -> bytes:
    """The bench host on ``port``'s MAC."""
    return bytes([2, 0, 0, 0, 0, port])


def host_ip(port: int) -> bytes:
    """The bench host on ``port``'s IPv4 address."""
    return bytes([10, 0, 0, port])


def mac_bytes(text: str) -> bytes:
    """``"02:ff:00:00:00:01"`` as 6 bytes."""
    return bytes.fromhex(text.replace(":", ""))


def ip_bytes(text: str) -> bytes:
    """``"10.0.255.1"`` as 4 bytes."""
    return socket.inet_aton(text)


def mac_text(mac: bytes) -> str:
    """6 bytes as ``"02:ff:00:00:00:01"`` (what Scapy and P4Runtime tooling print)."""
    return ":".join(f"{b:02x}" for b in mac)


def ip_text(ip: bytes) -> str:
    return socket.inet_ntoa(ip)


def ipv4_checksum(header: bytes | bytearray) -> int:
    """RFC 791 checksum over ``header`` (any length: options included; its checksum field
    zero)."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def with_ip_checksum(frame: bytes, ip_start: int = IP_START) -> bytes:
    """``frame`` with the IPv4 header at ``ip_start`` given its right checksum (after an edit
    to it: a forged field must not also be a bad checksum)."""
    ihl = (frame[ip_start] & 0x0F) * 4 or 20
    header = bytearray(frame[ip_start:ip_start + ihl])
    header[10:12] = b"\0\0"
    header[10:12] = ipv4_checksum(bytes(header)).to_bytes(2, "big")
    return frame[:ip_start] + bytes(header) + frame[ip_start + ihl:]


def ipv4_header(src: bytes, dst: bytes, length: int, *, tos: int = 0, ident: int = 0,
                flags: int = 0, ttl: int = 64, protocol: int = UDP_PROTOCOL,
                checksum: bool = True) -> bytes:
    """A 20-byte IPv4 header (``flags``: the whole flags/fragment-offset word). ``checksum``
    False leaves the field zero (the pipeline never checks it)."""
    header = IPV4_STRUCT.pack(0x45, tos, length, ident, flags, ttl, protocol, 0, src, dst)
    if not checksum:
        return header
    return header[:10] + ipv4_checksum(header).to_bytes(2, "big") + header[12:]


def udp_frame(dst_mac: bytes, src_mac: bytes, src_ip: bytes, dst_ip: bytes, sport: int,
              dport: int, payload: bytes, *, tos: int = 0, ident: int = 0, flags: int = 0,
              ttl: int = 64, ip_length: int | None = None, udp_length: int | None = None,
              udp_checksum: int = 0, ip_checksum: bool = True) -> bytes:
    """Ethernet / IPv4 (no options) / UDP around ``payload``. The lengths are the payload's
    unless given (a frame that lies about them); the UDP checksum 0 (none) unless given."""
    udp_length = 8 + len(payload) if udp_length is None else udp_length
    ip_length = 28 + len(payload) if ip_length is None else ip_length
    return b"".join((dst_mac, src_mac, ETHERTYPE_IPV4,
                     ipv4_header(src_ip, dst_ip, ip_length, tos=tos, ident=ident, flags=flags,
                                 ttl=ttl, checksum=ip_checksum),
                     UDP_STRUCT.pack(sport, dport, udp_length, udp_checksum), payload))


def aggregation_frame(port: int, job: int, worker: int, slot: int, version: int, offset: int,
                      values: Sequence[int], exponent: int = EXPONENT_NONE, owner: int = 0,
                      ptype: int = PacketType.DATA, count: int | None = None,
                      tos: int = 0, ident: int = 1, flags: int = 0, ttl: int = 64,
                      generation: int = 0) -> bytes:
    """What the bench host on ``port`` sends to the switch: a full aggregation frame from its
    job's UDP port (``values``: every lane of the width; ``count``: its blocks unless given;
    ``flags``: the IPv4 flags/offset word)."""
    if count is None:
        count = len(values) // LANES_PER_BLOCK
    header = pack_header(ptype, job, worker, slot, version, owner, exponent, count, offset,
                         generation)
    lanes = np.asarray(values, dtype=np.int64).astype(LANE_DTYPE).tobytes()
    return udp_frame(SWITCH_MAC, host_mac(port), host_ip(port), SWITCH_IP, job_udp_port(job),
                     BML_UDP_PORT, header + lanes, tos=tos, ident=ident, flags=flags, ttl=ttl)


def probe_frame(port: int, job: int, worker: int, slot: int, version: int, offset: int,
                owner: int = 0, generation: int = 0, count: int = DEFAULT_WIRE.blocks,
                tos: int = 0, ident: int = 1, flags: int = 0, ttl: int = 64) -> bytes:
    """What the bench host on ``port`` sends to ask whether its contribution is in: a PROBE,
    the header alone."""
    header = pack_header(PacketType.PROBE, job, worker, slot, version, owner, EXPONENT_NONE,
                         count, offset, generation)
    return udp_frame(SWITCH_MAC, host_mac(port), host_ip(port), SWITCH_IP, job_udp_port(job),
                     BML_UDP_PORT, header, tos=tos, ident=ident, flags=flags, ttl=ttl)


def reset_frame(mac: bytes, ip: bytes, job: int, slot: int, wire: Wire) -> bytes:
    """The controller's RESET of one slot (sent as a PacketOut), from and to the switch's own
    addresses, UDP from and to ``BML_UDP_PORT``; IPv4 identification and checksum zero (the
    frame is never forwarded). A full frame of the switch's width."""
    payload = pack_header(PacketType.RESET, job, 0, slot, count=wire.blocks) + wire.zero_lanes
    return udp_frame(mac, mac, ip, ip, BML_UDP_PORT, BML_UDP_PORT, payload, ip_checksum=False)


def udp_ports(frame: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(source, destination) UDP ports of an untagged IPv4/UDP frame without IPv4 options,
    else None."""
    if (len(frame) < BML_START or frame[12:14] != ETHERTYPE_IPV4 or frame[IP_START] != 0x45
            or frame[23] != UDP_PROTOCOL):
        return None
    return (int.from_bytes(frame[UDP_START:UDP_START + 2], "big"),
            int.from_bytes(frame[UDP_START + 2:UDP_START + 4], "big"))


def read_header(frame: bytes | bytearray | memoryview) -> tuple[int, ...] | None:
    """The BML header fields (as ``bml.protocol.unpack_header``) of an aggregation frame to or
    from ``BML_UDP_PORT``, else None."""
    ports = udp_ports(frame)
    if ports is None or BML_UDP_PORT not in ports or len(frame) < BML_START + HEADER_BYTES:
        return None
    return unpack_header(memoryview(frame)[BML_START:])
