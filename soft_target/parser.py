"""Where the headers lie in a frame, and which frames are aggregation packets: the software
target's twin of ``p4src/parser.p4`` (BmlParser; its deparser and checksum unit are folded
into ``egress_rewrite``, where each copy's bytes are assembled in one go).

hdr.bml is unpacked once per packet into plain values that the controls take as arguments;
every other field is read in place at these offsets, so no header object is ever built.
"""

from __future__ import annotations

import struct

import numpy as np

from bml.protocol import BML_UDP_PORT, HEADER_BYTES, HEADER_STRUCT, Wire

ETH, IP, UDP = 14, 20, 8
BML_OFF = ETH + IP + UDP  # 42
VALUES_OFF = BML_OFF + HEADER_BYTES  # 58: hdr.b00 starts here
HEADER_END = VALUES_OFF  # 58: a PROBE or GENERATION question, hdr.bml alone
IPV4_LEN_HEADER_ONLY, UDP_LEN_HEADER_ONLY = IP + UDP + HEADER_BYTES, UDP + HEADER_BYTES  # 44, 24
IPV4_WORDS = struct.Struct("!10H")
UDP_HALF = struct.Struct("!HH")  # two words of the UDP header: ports, or length and checksum
IPV4_HEAD = struct.Struct("!BBH2s2sBBH")  # up to the checksum; the addresses follow
unpack_bml = HEADER_STRUCT.unpack_from  # hdr.bml: (type, version, job_id, worker_id, owner_id,
# slot, exponent, count, generation, offset)
_BML_PORT_BYTES = BML_UDP_PORT.to_bytes(2, "big")


def is_bml(frame: bytes) -> bool:
    """Whether BmlParser reaches parse_bml: untagged IPv4, version 4, IHL 5, not a fragment
    (MF clear, offset 0), UDP to BML_UDP_PORT. Anything else (802.1Q tags included) is
    ordinary traffic."""
    return (
        len(frame) >= BML_OFF
        and frame[12:14] == b"\x08\x00"
        and frame[14] == 0x45
        and (frame[20] & 0x3F) == 0 == frame[21]
        and frame[23] == 17
        and frame[36:38] == _BML_PORT_BYTES
    )


def ipv4_checksum(header: bytes | bytearray) -> int:
    """RFC 791 checksum of a 20-byte header whose checksum field is zero (BmlComputeChecksum)."""
    total = sum(IPV4_WORDS.unpack_from(header))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def full_lengths(wire: Wire) -> tuple[int, int]:
    """IPV4_LEN_FULL and UDP_LEN_FULL at ``wire``'s width."""
    return IP + UDP + wire.payload_bytes, UDP + wire.payload_bytes


# A batch's headers as one numpy record per frame (``batch.FrameBatch.headers``): what
# ``is_bml`` and ``unpack_bml`` read, for every frame of a batch at once.
HEADERS = np.dtype([
    ("macs", "V12"), ("ethertype", ">u2"),
    ("version_ihl", "u1"), ("tos", "u1"), ("ipv4_len", ">u2"), ("ident", ">u2"),
    ("flags_fragment", ">u2"), ("ttl", "u1"), ("protocol", "u1"), ("ipv4_checksum", ">u2"),
    ("addresses", "V8"),
    ("src_port", ">u2"), ("dst_port", ">u2"), ("udp_len", ">u2"), ("udp_checksum", ">u2"),
    ("type", "u1"), ("version", "u1"), ("job_id", ">u2"), ("worker_id", "u1"),
    ("owner_id", "u1"), ("slot", ">u2"), ("exponent", "u1"), ("count", "u1"),
    ("generation", ">u2"), ("offset", ">u4"),
])
assert HEADERS.itemsize == HEADER_END


def batch_is_bml(headers: np.ndarray) -> np.ndarray:
    """``is_bml`` of every record of ``FrameBatch.headers``."""
    return ((headers["ethertype"] == 0x0800) & (headers["version_ihl"] == 0x45)
            & ((headers["flags_fragment"] & 0x3FFF) == 0) & (headers["protocol"] == 17)
            & (headers["dst_port"] == BML_UDP_PORT))
