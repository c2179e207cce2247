"""Where the headers lie in a frame, and which frames are aggregation packets: the software
target's twin of ``p4src/parser.p4`` (BmlParser; its deparser and checksum unit are folded
into ``egress_rewrite``, where each copy's bytes are assembled in one go).

hdr.bml is unpacked once per packet into plain values that the controls take as arguments;
every other field is read in place at these offsets, so no header object is ever built.
"""

from __future__ import annotations

import struct

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
