"""The one wire protocol: the Python definition and the P4 program agree on every constant."""

from __future__ import annotations

import re

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from bml import protocol
from bml.layers import BML, packet_values, values_layers
from bml.paths import P4SRC_DIR
from bml.protocol import (
    BUILT_LANES,
    DEFAULT_LANES,
    DEFAULT_WIRE,
    HEADER_BYTES,
    HEADER_ONLY_FRAME_BYTES,
    HEADER_STRUCT,
    LANES_PER_BLOCK,
    WIDEST_LANES,
    DropReason,
    PacketType,
    Stat,
    WidthError,
    generation_question,
    pack_header,
    unpack_header,
    width_mismatch,
    wire,
)

_DEFINE = re.compile(r"^#define (\w+) (.+?)\s*(?://.*)?$", re.M)


def p4_defines(lane_blocks: int | None = None) -> dict[str, int]:
    """defines.p4's constants as p4c sees them with -DLANE_BLOCKS=``lane_blocks`` (None: as
    the file defaults it): each value an integer or an arithmetic expression of others."""
    text = (P4SRC_DIR / "include" / "defines.p4").read_text()
    values: dict[str, int] = {} if lane_blocks is None else {"LANE_BLOCKS": lane_blocks}
    for name, expression in _DEFINE.findall(text):
        if name in values:
            continue  # given on the command line: the file's #ifndef default does not apply
        python = re.sub(r"\b([A-Z_][A-Z0-9_]*)\b", lambda m: f"values[{m.group(1)!r}]",
                        expression)
        if not re.fullmatch(r"[\s\w\[\]'()+*x-]+", python):
            continue  # not a number (a header guard has none)
        values[name] = eval(python, {"values": values})  # our own file
    return values


def test_constants_match_defines_p4():
    defines = p4_defines()
    assert defines["BML_UDP_PORT"] == protocol.BML_UDP_PORT
    assert defines["CPU_PORT"] == protocol.CPU_PORT
    assert defines["CONTROLLER_MAGIC"] == protocol.CONTROLLER_MAGIC
    assert defines["LANE_BLOCKS"] == DEFAULT_WIRE.blocks  # the default build's
    assert defines["LANES_PER_BLOCK"] == LANES_PER_BLOCK
    assert defines["POOL_SLOTS"] == protocol.POOL_SLOTS
    assert defines["POOL_COPIES"] == 2 * protocol.POOL_SLOTS
    assert defines["MAX_WORKERS"] == protocol.MAX_WORKERS
    assert defines["STATS_SIZE"] == protocol.STATS_SIZE
    assert defines["DROPS_SIZE"] == protocol.DROPS_SIZE
    assert defines["IPV4_LEN_HEADER_ONLY"] == 20 + 8 + HEADER_BYTES
    assert defines["UDP_LEN_HEADER_ONLY"] == 8 + HEADER_BYTES
    assert defines["HEADER_ONLY_FRAME_BYTES"] == HEADER_ONLY_FRAME_BYTES
    for ptype in PacketType:
        assert defines[f"TYPE_{ptype.name}"] == ptype.value, ptype
    for stat in Stat:
        assert defines[f"STAT_{stat.name}"] == stat.value, stat
    for reason in DropReason:
        assert defines[f"DROP_{reason.name}"] == reason.value, reason
    assert max(Stat) < protocol.STATS_SIZE and max(DropReason) < protocol.DROPS_SIZE


def test_lengths_match_defines_p4_at_every_width():
    """The lengths defines.p4 derives from LANE_BLOCKS are the Wire's, at every built width;
    lanes.p4 lists exactly those widths."""
    for lanes in BUILT_LANES:
        sizes = wire(lanes)
        defines = p4_defines(sizes.blocks)
        assert defines["LANES"] == lanes
        assert defines["IPV4_LEN_FULL"] == 20 + 8 + sizes.payload_bytes
        assert defines["UDP_LEN_FULL"] == 8 + sizes.payload_bytes
        assert defines["FRAME_BYTES"] == sizes.frame_bytes
    text = (P4SRC_DIR / "include" / "lanes.p4").read_text()
    listed = [int(n) for n in re.findall(r"^#(?:el)?if LANE_BLOCKS == (\d+)$", text, re.M)]
    assert listed == [lanes // LANES_PER_BLOCK for lanes in BUILT_LANES]
    for blocks in listed:
        body = re.search(rf"^#(?:el)?if LANE_BLOCKS == {blocks}\n(.*?)^#el", text,
                         re.S | re.M).group(1)
        names = re.findall(r"M\((b\d\d)\)", body)
        assert names == [f"b{i:02d}" for i in range(blocks)]
        assert re.search(rf"#define LAST_BLOCK b{blocks - 1:02d}\b", body)


def test_widths():
    assert DEFAULT_LANES == 64 and DEFAULT_WIRE.frame_bytes == 314
    assert WIDEST_LANES == 2208 and wire(WIDEST_LANES).frame_bytes == 8890
    assert 14 + 20 + 8 + HEADER_BYTES + 4 * (WIDEST_LANES + LANES_PER_BLOCK) > 14 + 9000
    for bad in (0, 33, WIDEST_LANES + LANES_PER_BLOCK):
        try:
            wire(bad)
        except WidthError:
            continue
        raise AssertionError(f"{bad} lanes accepted")


def test_header_layout_matches_headers_p4():
    """Field order and widths of bml_t in headers.p4 are the Scapy layer's."""
    text = (P4SRC_DIR / "include" / "headers.p4").read_text()
    body = re.search(r"header bml_t \{(.*?)\}", text, re.S).group(1)
    p4_fields = re.findall(r"bit<(\d+)>\s+(\w+);", body)
    scapy_fields = [(str(f.sz * 8), f.name) for f in BML.fields_desc]
    assert p4_fields == scapy_fields
    assert sum(int(w) for w, _ in p4_fields) == 8 * HEADER_BYTES == 8 * HEADER_STRUCT.size
    values_body = re.search(r"header values_t \{(.*?)\}", text, re.S).group(1)
    assert re.findall(r"bit<32> (v\d\d);", values_body) == [
        f"v{i:02d}" for i in range(LANES_PER_BLOCK)]
    assert "FOR_BLOCKS(BLOCK_FIELD)" in re.search(r"struct headers_t \{(.*?)\}", text,
                                                  re.S).group(1)


def test_scapy_layer_and_struct_agree():
    for lanes in BUILT_LANES:
        sizes = wire(lanes)
        header = pack_header(PacketType.DATA, job_id=513, worker_id=7, slot=1000, version=1,
                             owner_id=3, exponent=140, count=sizes.blocks, offset=123456)
        frame = Ether() / IP() / UDP(dport=protocol.BML_UDP_PORT) / header / sizes.zero_lanes
        parsed = Ether(bytes(frame))
        bml = parsed[BML]
        assert (bml.type, bml.version, bml.job_id, bml.worker_id, bml.owner_id, bml.slot,
                bml.exponent, bml.count, bml.offset) == (1, 1, 513, 7, 3, 1000, 140,
                                                         sizes.blocks, 123456)
        assert unpack_header(bytes(bml)[:HEADER_BYTES])[:8] == (1, 1, 513, 7, 3, 1000, 140,
                                                                 sizes.blocks)
        assert len(frame) == sizes.frame_bytes
        assert packet_values(parsed) == [0] * lanes


def test_values_round_trip_through_scapy():
    for lanes in BUILT_LANES:
        values = list(range(-lanes // 2, lanes // 2))
        frame = Ether(bytes(Ether() / IP() / UDP(dport=protocol.BML_UDP_PORT) / BML()
                            / values_layers(values, lanes)))
        assert packet_values(frame) == values
        result = Ether(bytes(Ether() / IP() / UDP(sport=protocol.BML_UDP_PORT, dport=40001)
                             / BML() / values_layers([5], lanes)))
        assert packet_values(result) == [5] + [0] * (lanes - 1)
    header_only = Ether(bytes(Ether() / IP() / UDP(dport=protocol.BML_UDP_PORT) / BML()))
    assert packet_values(header_only) == []


def test_generation_question_is_header_only_with_the_senders_blocks():
    for lanes in BUILT_LANES:
        asked = generation_question(5, 3, wire(lanes))
        assert len(asked) == HEADER_BYTES
        fields = unpack_header(asked)
        assert (fields[0], fields[2], fields[3], fields[7]) == (
            PacketType.GENERATION, 5, 3, lanes // LANES_PER_BLOCK)
    assert width_mismatch(2, DEFAULT_WIRE, "s") is None
    assert "2208 lanes" in width_mismatch(69, DEFAULT_WIRE, "s")


def test_protocol_doc_lists_every_field_and_type():
    doc = (P4SRC_DIR.parent / "docs" / "PROTOCOL.md").read_text()
    for field in BML.fields_desc:
        assert f"`{field.name}`" in doc, field.name
    for ptype in PacketType:
        assert ptype.name in doc, ptype.name
    for reason in DropReason:
        assert reason.name in doc, reason.name
