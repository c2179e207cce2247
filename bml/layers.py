"""The aggregation packet as Scapy layers, for tests and inspection: ``BML`` (the 16-byte
header) and ``Lanes`` (the values after it), bound to UDP port ``BML_UDP_PORT`` both ways.

The same layout as ``bml.protocol`` (``HEADER_STRUCT``), which the hot paths use; this module is
apart from it so that host and switch processes never import Scapy. ``tests/test_protocol.py``
checks the two, and the P4 headers, field for field.
"""

from __future__ import annotations

import numpy as np
from scapy.fields import (
    ByteEnumField,
    ByteField,
    FieldListField,
    IntField,
    ShortField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from bml.protocol import (
    BML_UDP_PORT,
    DEFAULT_LANES,
    DEFAULT_WIRE,
    EXPONENT_NONE,
    LANE_DTYPE,
    PacketType,
    WidthError,
)


class BML(Packet):
    """The 16-byte aggregation header."""

    name = "BML"
    fields_desc = [
        ByteEnumField("type", PacketType.DATA, {t.value: t.name for t in PacketType}),
        ByteField("version", 0),
        ShortField("job_id", 0),
        ByteField("worker_id", 0),
        ByteField("owner_id", 0),
        ShortField("slot", 0),
        ByteField("exponent", EXPONENT_NONE),
        ByteField("count", DEFAULT_WIRE.blocks),
        ShortField("generation", 0),
        IntField("offset", 0),
    ]


class Lanes(Packet):
    """The lanes after the header, as many as the packet holds (the payload's length tells)."""

    name = "Lanes"
    fields_desc = [FieldListField("values", [], SignedIntField("", 0))]

    def do_dissect(self, s: bytes) -> bytes:
        whole = len(s) // 4 * 4
        self.values = np.frombuffer(s[:whole], dtype=LANE_DTYPE).tolist()
        return s[whole:]

    def self_build(self) -> bytes:
        return np.asarray(self.values, dtype=np.int64).astype(LANE_DTYPE).tobytes()


bind_layers(UDP, BML, dport=BML_UDP_PORT)
bind_layers(UDP, BML, sport=BML_UDP_PORT)  # results the switch sends back
bind_layers(BML, Lanes)


def values_layers(values: list[int] | tuple[int, ...], lanes: int = DEFAULT_LANES) -> Packet:
    """The lanes layer carrying ``values`` zero-padded to ``lanes``."""
    if len(values) > lanes:
        raise WidthError(f"{len(values)} values do not fit {lanes} lanes")
    return Lanes(values=[int(v) for v in values] + [0] * (lanes - len(values)))


def packet_values(pkt: Packet) -> list[int]:
    """The lanes of a parsed Scapy packet (empty if it carries none)."""
    if Lanes not in pkt:
        return []
    return [int(v) for v in pkt[Lanes].values]
