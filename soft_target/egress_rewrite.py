"""Addressing every switch-made copy to the host on its port: the software target's twin of
``p4src/egress_rewrite.p4`` (programmed by ``control_plane/egress_rewrite.py``), with the
deparser and checksum unit of ``p4src/parser.p4``, so that each copy's bytes are put together
once, from parts shared by all copies and parts precomputed per port at table write."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from bml.protocol import BML_UDP_PORT, LANE_DTYPE, Wire
from control_plane.p4info import Names
from soft_target.batch import ResultBlock
from soft_target.defines import TYPE_ACK, TYPE_BROADCAST
from soft_target.parser import (
    BML_OFF,
    ETH,
    IPV4_HEAD,
    IPV4_LEN_HEADER_ONLY,
    UDP_HALF,
    UDP_LEN_HEADER_ONLY,
    VALUES_OFF,
    full_lengths,
)
from soft_target.tables import Row, SoftTable, byte_params


@dataclass(frozen=True)
class HostAddress:
    """The parameters of ``set_host_address`` (filled by the P4Info's names and widths), with
    what every copy to that port shares precomputed once per table write (the packet loop only
    adds the per-packet part)."""

    host_mac: bytes
    host_ip: bytes
    switch_mac: bytes
    switch_ip: bytes
    ethernet: bytes = field(init=False, repr=False, compare=False)  # dst, src, IPv4 type
    addresses: bytes = field(init=False, repr=False, compare=False)  # IPv4 src, dst
    address_sum: int = field(init=False, repr=False, compare=False)  # their checksum words

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "ethernet", self.host_mac + self.switch_mac + b"\x08\x00")
        set_field(self, "addresses", self.switch_ip + self.host_ip)
        set_field(self, "address_sum", sum(struct.unpack("!4H", self.addresses)))


@dataclass
class EgressRewriteTables:
    """Egress rewrite's part of ``pipeline.Tables``."""

    host_address: dict[int, HostAddress] = field(default_factory=dict)  # egress port -> host


def _compile_host_address(rows: list[Row]) -> dict[int, HostAddress]:
    return {key[0]: HostAddress(**byte_params(action, params)) for key, action, params in rows}


TABLES = {
    Names.HOST_ADDRESS: SoftTable("host_address", _compile_host_address),
}


class EgressRewrite:
    """Holds egress_rewrite.p4's ``unaddressed`` counter: copies to a port with no host."""

    def __init__(self, wire: Wire) -> None:
        self.unaddressed = [0]
        self.ipv4_len_full, self.udp_len_full = full_lengths(wire)
        self.frame_bytes = wire.frame_bytes

    def apply(self, tables: EgressRewriteTables, frame: bytes, port: int, ptype: int,
              exponent: int, values: bytes, generation: int | None, count: int | None,
              egress_ports: tuple[int, ...], owner_port: int | None
              ) -> list[tuple[int, bytes]]:
        """The copies, as (egress port, frame), of the packet ResultRouting sends to
        ``egress_ports``: ``frame`` is the trigger, with the header fields ingress changed
        (type, exponent, and ``generation`` or ``count`` when given) written here; with an
        ``owner_port``, every other port gets a header-only ACK."""
        # IPv4: what the trigger gives (TOS, id, flags) and what the switch writes (TTL 64,
        # UDP, fixed lengths); per copy only the length and the addresses change the checksum.
        tos, ident, flags = frame[ETH + 1], frame[ETH + 4:ETH + 6], frame[ETH + 6:ETH + 8]
        trigger_sum = (0x4500 | tos) + (ident[0] << 8 | ident[1]) + (flags[0] << 8 | flags[1]) \
            + 0x4011
        udp_ports = UDP_HALF.pack(BML_UDP_PORT, frame[34] << 8 | frame[35])
        bml = bytearray(frame[BML_OFF:VALUES_OFF])
        bml[0] = ptype
        bml[8] = exponent
        if generation is not None:
            bml[10:12] = generation.to_bytes(2, "big")
        if count is not None:
            bml[9] = count
        full_body = bytes(bml) + values
        host_address = tables.host_address
        out = []
        for egress_port in egress_ports:
            if ptype == TYPE_BROADCAST and egress_port == port:
                continue
            address = host_address.get(egress_port)
            if address is None:
                self.unaddressed[0] += 1
                continue
            if owner_port is not None and egress_port != owner_port:
                bml[0] = TYPE_ACK
                body = bytes(bml)
                ip_len, udp_len = IPV4_LEN_HEADER_ONLY, UDP_LEN_HEADER_ONLY
            elif not values:
                body = full_body
                ip_len, udp_len = IPV4_LEN_HEADER_ONLY, UDP_LEN_HEADER_ONLY
            else:
                body = full_body
                ip_len, udp_len = self.ipv4_len_full, self.udp_len_full
            total = trigger_sum + ip_len + address.address_sum
            total = (total & 0xFFFF) + (total >> 16)
            total = (total & 0xFFFF) + (total >> 16)
            out.append((egress_port, b"".join((
                address.ethernet,
                IPV4_HEAD.pack(0x45, tos, ip_len, ident, flags, 64, 17, ~total & 0xFFFF),
                address.addresses, udp_ports, UDP_HALF.pack(udp_len, 0), body))))
        return out

    def apply_results(self, tables: EgressRewriteTables, raw_headers: np.ndarray, ptype: int,
                      exponents: np.ndarray, sums: np.ndarray, egress_ports: tuple[int, ...]
                      ) -> ResultBlock:
        """``apply`` of many full-width packets of type ``ptype`` (not BROADCAST, no owner)
        to the same ``egress_ports``, built as one numpy array: row i of ``raw_headers`` is
        trigger i's first HEADER_END bytes, ``exponents[i]`` and ``sums[i]`` what its copies
        carry. Each trigger's copies, in port order, byte for byte as ``apply`` makes them,
        left in the array they were built in (the switch sends them from there)."""
        triggers = len(raw_headers)
        host_address = tables.host_address
        addresses = [(port, host_address[port]) for port in egress_ports
                     if port in host_address]
        self.unaddressed[0] += (len(egress_ports) - len(addresses)) * triggers
        ports = len(addresses)
        out = np.empty((triggers, ports, self.frame_bytes), np.uint8)
        if not addresses:
            return ResultBlock((), out)
        for j, (_port, address) in enumerate(addresses):
            out[:, j, :ETH] = np.frombuffer(address.ethernet, np.uint8)
            out[:, j, ETH + 12:ETH + 20] = np.frombuffer(address.addresses, np.uint8)
        ip_len, udp_len = self.ipv4_len_full, self.udp_len_full
        out[:, :, ETH] = 0x45
        out[:, :, ETH + 1:ETH + 2] = raw_headers[:, None, ETH + 1:ETH + 2]  # TOS
        out[:, :, ETH + 2] = ip_len >> 8
        out[:, :, ETH + 3] = ip_len & 0xFF
        out[:, :, ETH + 4:ETH + 8] = raw_headers[:, None, ETH + 4:ETH + 8]  # id, flags
        out[:, :, ETH + 8] = 64
        out[:, :, ETH + 9] = 17
        words = raw_headers[:, ETH:ETH + 8].astype(np.int64)
        trigger_sum = (0x4500 | words[:, 1]) + (words[:, 4] << 8 | words[:, 5]) \
            + (words[:, 6] << 8 | words[:, 7]) + 0x4011 + ip_len
        total = trigger_sum[:, None] + np.array([a.address_sum for _, a in addresses])
        total = (total & 0xFFFF) + (total >> 16)
        total = (total & 0xFFFF) + (total >> 16)
        checksum = ~total & 0xFFFF
        out[:, :, ETH + 10] = checksum >> 8
        out[:, :, ETH + 11] = checksum & 0xFF
        udp = ETH + 20
        out[:, :, udp] = BML_UDP_PORT >> 8
        out[:, :, udp + 1] = BML_UDP_PORT & 0xFF
        out[:, :, udp + 2:udp + 4] = raw_headers[:, None, udp:udp + 2]  # to the sender's port
        out[:, :, udp + 4] = udp_len >> 8
        out[:, :, udp + 5] = udp_len & 0xFF
        out[:, :, udp + 6:udp + 8] = 0
        out[:, :, BML_OFF:VALUES_OFF] = raw_headers[:, None, BML_OFF:VALUES_OFF]
        out[:, :, BML_OFF] = ptype
        out[:, :, BML_OFF + 8] = exponents[:, None]
        out[:, :, VALUES_OFF:] = sums.astype(LANE_DTYPE).view(np.uint8)[:, None, :]
        return ResultBlock(tuple(port for port, _ in addresses), out)
