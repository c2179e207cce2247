"""Frame shapes only tests send: an aggregation frame broken at the Ethernet, IPv4 or UDP
level. The differential sequence and the hostile traffic both forge these; each mutation keeps
the IPv4 checksum right unless the field it breaks is what the checksum is computed from
(IHL), so that the fault is the one named and no other."""

from __future__ import annotations

from bml.frames import with_ip_checksum


def tagged(frame: bytes, tci: bytes, qinq: bool = False) -> bytes:
    """An 802.1Q tag (``qinq``: an 802.1ad tag and then an 802.1Q one) before the EtherType."""
    tag = (b"\x88\xa8" + tci + b"\x81\x00" + tci) if qinq else b"\x81\x00" + tci
    return frame[:12] + tag + frame[12:]


def ip_version(frame: bytes, version: int) -> bytes:
    """Another IP version in the IPv4 header (IHL 5)."""
    return with_ip_checksum(frame[:14] + bytes([version << 4 | 5]) + frame[15:])


def ip_ihl(frame: bytes, ihl: int) -> bytes:
    """Another IHL nibble alone: the bytes after the first 20 stay what they were."""
    return frame[:14] + bytes([0x40 | ihl]) + frame[15:]


def ip_options(frame: bytes, words: int) -> bytes:
    """``words`` 32-bit words of IPv4 options (NOPs, then an end of list), lengths to match."""
    header = bytearray(frame[14:34])
    header[0] = 0x40 | (5 + words)
    header[2:4] = (int.from_bytes(header[2:4], "big") + 4 * words).to_bytes(2, "big")
    return with_ip_checksum(frame[:14] + bytes(header) + b"\x01" * (4 * words - 1) + b"\x00"
                            + frame[34:])


def more_fragments(frame: bytes) -> bytes:
    """The IPv4 more-fragments flag set: a first fragment."""
    return with_ip_checksum(frame[:20] + bytes([frame[20] | 0x20]) + frame[21:])


def fragment_offset(frame: bytes, offset: int) -> bytes:
    """A non-zero IPv4 fragment offset (in 8-byte units): a later fragment."""
    return with_ip_checksum(frame[:20] + bytes([frame[20] & 0xE0 | offset >> 8, offset & 0xFF])
                            + frame[22:])


def ip_protocol(frame: bytes, protocol: int) -> bytes:
    """Another IPv4 protocol than UDP."""
    return with_ip_checksum(frame[:23] + bytes([protocol]) + frame[24:])


def ip_length(frame: bytes, length: int) -> bytes:
    """An IPv4 total length that is not the frame's."""
    return with_ip_checksum(frame[:16] + length.to_bytes(2, "big") + frame[18:])


def udp_length(frame: bytes, length: int) -> bytes:
    """A UDP length that is not the datagram's."""
    return frame[:38] + length.to_bytes(2, "big") + frame[40:]
