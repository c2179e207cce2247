"""The one wire protocol: the Python definition and the P4 program agree on every constant."""

from __future__ import annotations

import re

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from bml import protocol
from bml.paths import P4SRC_DIR
from bml.protocol import (
    BML,
    FRAME_BYTES,
    HEADER_BYTES,
    HEADER_STRUCT,
    PAYLOAD_BYTES,
    VALUES_PER_PACKET,
    DropReason,
    PacketType,
    Stat,
    pack_header,
    packet_values,
    unpack_header,
    values_layers,
)


def p4_defines() -> dict[str, int]:
    text = (P4SRC_DIR / "include" / "defines.p4").read_text()
    return {name: int(value, 0) for name, value in
            re.findall(r"^#define (\w+) (0x[0-9A-Fa-f]+|\d+)", text, re.M)}


def test_constants_match_defines_p4():
    defines = p4_defines()
    assert defines["BML_UDP_PORT"] == protocol.BML_UDP_PORT
    assert defines["CPU_PORT"] == protocol.CPU_PORT
    assert defines["CONTROLLER_MAGIC"] == protocol.CONTROLLER_MAGIC
    assert defines["VALUES_PER_PACKET"] == VALUES_PER_PACKET
    assert defines["POOL_SLOTS"] == protocol.POOL_SLOTS
    assert defines["POOL_COPIES"] == 2 * protocol.POOL_SLOTS
    assert defines["MAX_WORKERS"] == protocol.MAX_WORKERS
    assert defines["STATS_SIZE"] == protocol.STATS_SIZE
    assert defines["DROPS_SIZE"] == protocol.DROPS_SIZE
    assert defines["IPV4_LEN_FULL"] == 20 + 8 + PAYLOAD_BYTES
    assert defines["UDP_LEN_FULL"] == 8 + PAYLOAD_BYTES
    assert defines["IPV4_LEN_HEADER_ONLY"] == 20 + 8 + HEADER_BYTES
    for ptype in PacketType:
        assert defines[f"TYPE_{ptype.name}"] == ptype.value, ptype
    for stat in Stat:
        assert defines[f"STAT_{stat.name}"] == stat.value, stat
    for reason in DropReason:
        assert defines[f"DROP_{reason.name}"] == reason.value, reason
    assert max(Stat) < protocol.STATS_SIZE and max(DropReason) < protocol.DROPS_SIZE


def test_header_layout_matches_headers_p4():
    """Field order and widths of bml_t in headers.p4 are the Scapy layer's."""
    text = (P4SRC_DIR / "include" / "headers.p4").read_text()
    body = re.search(r"header bml_t \{(.*?)\}", text, re.S).group(1)
    p4_fields = re.findall(r"bit<(\d+)>\s+(\w+);", body)
    scapy_fields = [(str(f.sz * 8), f.name) for f in BML.fields_desc]
    assert p4_fields == scapy_fields
    assert sum(int(w) for w, _ in p4_fields) == 8 * HEADER_BYTES == 8 * HEADER_STRUCT.size
    values_body = re.search(r"header values_t \{(.*?)\}", text, re.S).group(1)
    assert len(re.findall(r"bit<32> v\d\d;", values_body)) * 2 == VALUES_PER_PACKET


def test_scapy_layer_and_struct_agree():
    header = pack_header(PacketType.DATA, job_id=513, worker_id=7, slot=1000, version=1,
                         owner_id=3, exponent=140, count=60, offset=123456)
    frame = Ether() / IP() / UDP(dport=protocol.BML_UDP_PORT) / header / bytes(256)
    parsed = Ether(bytes(frame))
    bml = parsed[BML]
    assert (bml.type, bml.version, bml.job_id, bml.worker_id, bml.owner_id, bml.slot,
            bml.exponent, bml.count, bml.offset) == (1, 1, 513, 7, 3, 1000, 140, 60, 123456)
    assert unpack_header(bytes(bml)[:HEADER_BYTES])[:8] == (1, 1, 513, 7, 3, 1000, 140, 60)
    assert len(frame) == FRAME_BYTES


def test_values_round_trip_through_scapy():
    values = list(range(-32, 32))
    frame = Ether(bytes(Ether() / IP() / UDP(dport=protocol.BML_UDP_PORT) / BML()
                        / values_layers(values)))
    assert packet_values(frame) == values
    result = Ether(bytes(Ether() / IP() / UDP(sport=protocol.BML_UDP_PORT, dport=40001) / BML()
                         / values_layers([5])))
    assert packet_values(result) == [5] + [0] * 63


def test_protocol_doc_lists_every_field_and_type():
    doc = (P4SRC_DIR.parent / "docs" / "PROTOCOL.md").read_text()
    for field in BML.fields_desc:
        assert f"`{field.name}`" in doc, field.name
    for ptype in PacketType:
        assert ptype.name in doc, ptype.name
    for reason in DropReason:
        assert reason.name in doc, reason.name
