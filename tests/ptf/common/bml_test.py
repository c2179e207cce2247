"""Helpers for the packet tests: a P4Runtime session, per-port hosts, frame builders.

The tests speak only P4Runtime and packets, so they run unchanged against the software target
and against simple_switch_grpc; ``tests/test_packets.py`` starts either one and runs PTF.
The lane width is the pipeline's: test parameter ``lanes`` (default 64) chooses which of
p4src/build's pipelines ``setUp`` loads, and every helper here then builds and expects frames of
the width that pipeline's P4Info says (``lanes()``, ``blocks()``); no test assumes one.
Port p (1..8) has a host behind it and the switch has one address on every port, as
``bml.frames`` names them for every single-switch bench (MAC 02:00:00:00:00:pp and IP 10.0.0.p;
02:ff:00:00:00:01 / 10.0.255.1). Here they are text, as Scapy takes them. PTF runs this with
the repository on its path (``--pypath``, and the insert below), so ``bml`` imports.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import ptf
import ptf.testutils as tu
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2
from p4runtime_sh.p4runtime import P4RuntimeWriteException
from ptf.base_tests import BaseTest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from bml import frames
from bml.layers import BML, values_layers
from bml.protocol import (
    BML_UDP_PORT,
    DEFAULT_LANES,
    DEFAULT_WIRE,
    EXPONENT_NONE,
    HEADER_BYTES,
    DropReason,
    PacketType,
    ResultMode,
    Stat,
    Wire,
    job_udp_port,
    wire,
)
from bml.topology import Switch
from bml.topology import ip_to_int as ip_int
from bml.topology import mac_to_int as mac_int
from control_plane.aggregation import reset_frames
from control_plane.egress_rewrite import host_address_entry
from control_plane.jobs import AggregationGroup
from control_plane.p4info import Names, built_p4info
from control_plane.provision import install_group, remove_group
from control_plane.session import SwitchSession

PORTS = tuple(range(1, 9))
SWITCH_MAC = frames.mac_text(frames.SWITCH_MAC)
SWITCH_IP = frames.ip_text(frames.SWITCH_IP)
# The switch object the control plane's frame builders need (only its addresses are used).
SWITCH = Switch("dut", 0, 0, 1, PORTS)


__all__ = ["PORTS", "SWITCH", "SWITCH_IP", "SWITCH_MAC", "BmlTest", "blocks", "contribution",
           "from_switch", "host_ip", "host_mac", "ip_int", "lane_sums", "lanes", "mac_int",
           "other_width", "probe", "probe_answers_sum", "question", "wrap32"]

# The width of the pipeline the running test loaded (BmlTest.setUp sets it from its P4Info).
_wire: Wire = DEFAULT_WIRE
_pushed: tuple[str, int] | None = None  # (switch address, lanes) this PTF run pushed


def lanes() -> int:
    """Lanes per packet of the pipeline under test."""
    return _wire.lanes


def blocks() -> int:
    """Blocks per packet of the pipeline under test: what a contribution's count says."""
    return _wire.blocks


# No answer is larger than its question by more than this: simple_switch gives a packet 512
# bytes to grow by (PacketBuffer(len + 512)); docs/PROTOCOL.md, "Switch behaviour per slot copy".
ANSWER_GROWTH_BYTES = 512


def probe_answers_sum() -> bool:
    """Does a PROBE (header only) into its completed copy get the stored sum at the pipeline's
    width? Only where the lanes fit in ANSWER_GROWTH_BYTES (up to 128 lanes); wider, MISSING,
    and the full frame re-sent gets the sum."""
    return _wire.values_bytes <= ANSWER_GROWTH_BYTES


def other_width() -> Wire:
    """A width that is not the pipeline's (a host of another build)."""
    return wire(256 if _wire.lanes == DEFAULT_LANES else DEFAULT_LANES)


def host_mac(port: int) -> str:
    return frames.mac_text(frames.host_mac(port))


def host_ip(port: int) -> str:
    return frames.ip_text(frames.host_ip(port))


class BmlTest(BaseTest):
    """Base class: a primary session, host addresses on every port, cleanup of what it wrote."""

    def setUp(self) -> None:
        BaseTest.setUp(self)
        self.dataplane = ptf.dataplane_instance
        self.dataplane.flush()
        params = tu.test_params_get()
        self.session = SwitchSession("dut", params.get("grpc_addr", "127.0.0.1:9559"),
                                     int(params.get("device_id", 1)), (0, 1),
                                     p4info=built_p4info(int(params.get("lanes", DEFAULT_LANES))))
        global _wire, _pushed
        pipeline = (self.session.address, self.session.p4info.lanes)
        if _pushed != pipeline:  # once per run: reading a wide P4Info back takes a while
            try:
                self.session.push_pipeline()
            except BaseException:
                self.session.close()  # tearDown does not run; the next test needs the id
                raise
            _pushed = pipeline
        self.wire = _wire = self.session.wire  # the loaded pipeline's (its P4Info.lanes)
        self.written: list = []
        self.groups: list[AggregationGroup] = []
        self.write(*[host_address_entry(p, frames.host_mac(p), frames.host_ip(p),
                                        frames.SWITCH_MAC, frames.SWITCH_IP) for p in PORTS])

    def tearDown(self) -> None:
        for group in reversed(self.groups):
            remove_group(self.session, SWITCH, group)
        if self.written:
            self.session.write_entries(reversed(self.written), kind="DELETE")
        self.session.close()
        BaseTest.tearDown(self)

    # ------------------------------------------------------------------ set-up
    def write(self, *entries) -> None:
        self.session.write_entries(entries)
        self.written.extend(entries)

    def add_job(self, job_id: int, ports: list[int], pool_base: int = 0, pool_size: int = 16,
                mode: int = ResultMode.MULTICAST) -> AggregationGroup:
        """Worker w of the job is attached to ports[w]."""
        group = AggregationGroup("dut", job_id, dict(enumerate(ports)), mode, pool_base,
                                 pool_size)
        install_group(self.session, SWITCH, group)
        self.groups.append(group)
        return group

    def send(self, port: int, packet) -> None:
        """Send ``packet`` on ``port`` and wait until the switch has counted it (its stats or
        drops moved): BMv2 keeps no order across its ports, so a packet sent next on another
        port could overtake it, and the slot would complete on another contribution than the
        one the test expects the answer to."""
        before = self.counters()
        tu.send_packet(self, port, packet)
        self.wait_for(lambda: self.counters() != before, f"the switch to count a packet sent "
                      f"on port {port}")

    def reset_slot(self, group: AggregationGroup, slot: int) -> None:
        before = self.stat(Stat.RESET)
        self.session.packet_out(reset_frames(SWITCH, group, self.wire)[slot])
        self.wait_for(lambda: self.stat(Stat.RESET) == before + 1, "slot reset")

    def packet_out_raw(self, session: SwitchSession, frame: bytes, magic: bytes) -> None:
        """A PacketOut whose ``magic`` metadata is these bytes, as given (the session's own
        ``packet_out`` always encodes the right one)."""
        request = p4runtime_pb2.StreamMessageRequest()
        request.packet.payload = frame
        metadata_id, _width = session.p4info.packet_out_metadata["magic"]
        request.packet.metadata.add(metadata_id=metadata_id, value=magic)
        session.client.stream_out_q.put(request)

    def write_code(self, kind: str, table_entry: p4runtime_pb2.TableEntry | None = None,
                   group: p4runtime_pb2.MulticastGroupEntry | None = None) -> str:
        """The canonical code the switch answers one update with ("OK" when it takes it)."""
        request = p4runtime_pb2.WriteRequest()
        update = request.updates.add(type=p4runtime_pb2.Update.Type.Value(kind))
        if table_entry is not None:
            update.entity.table_entry.CopyFrom(table_entry)
        else:
            update.entity.packet_replication_engine_entry.multicast_group_entry.CopyFrom(group)
        try:
            self.session.client.write(request)
        except P4RuntimeWriteException as exc:
            return code_pb2.Code.Name(exc.errors[0][1].canonical_code)
        return "OK"

    # ------------------------------------------------------------------ counters
    def stat(self, which: Stat) -> int:
        return self.session.read_counter(Names.STATS)[which]

    def drops(self, reason: DropReason) -> int:
        return self.session.read_counter(Names.DROPS)[reason]

    def counters(self) -> tuple[list[int], list[int]]:
        return self.session.read_counter(Names.STATS), self.session.read_counter(Names.DROPS)

    @staticmethod
    def wait_for(condition, what: str, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def assert_counted(self, before: tuple[list[int], list[int]],
                       stats: dict[Stat, int] | None = None,
                       drops: dict[DropReason, int] | None = None) -> None:
        """Exactly these counters moved by exactly these amounts (counters settle async)."""
        expected_stats = [before[0][s] + (stats or {}).get(Stat(s), 0)
                          for s in range(len(before[0])) if s in Stat._value2member_map_]
        expected_drops = [before[1][d] + (drops or {}).get(DropReason(d), 0)
                          for d in range(len(before[1])) if d in DropReason._value2member_map_]

        def current() -> tuple[list[int], list[int]]:
            now = self.counters()
            return ([now[0][s] for s in Stat], [now[1][d] for d in DropReason])

        deadline = time.monotonic() + 2.0
        while current() != (expected_stats, expected_drops) and time.monotonic() < deadline:
            time.sleep(0.05)
        got = current()
        self.assertEqual(dict(zip([s.name for s in Stat], got[0], strict=True)),
                         dict(zip([s.name for s in Stat], expected_stats, strict=True)))
        self.assertEqual(dict(zip([d.name for d in DropReason], got[1], strict=True)),
                         dict(zip([d.name for d in DropReason], expected_drops, strict=True)))


_ip_ids = itertools.count(1)


def contribution(port: int, job: int, worker: int, values, slot: int = 0, version: int = 0,
                 exponent: int = EXPONENT_NONE, offset: int = 0, owner: int = 0,
                 ptype: int = PacketType.DATA, count: int | None = None,
                 ip_id: int | None = None, generation: int = 0, width: Wire | None = None):
    """What a worker on ``port`` sends to the switch: a full frame of the pipeline's width
    (or ``width``'s: a host of another build), ``count`` its blocks unless given."""
    width = width or _wire
    return (Ether(dst=SWITCH_MAC, src=host_mac(port))
            / IP(src=host_ip(port), dst=SWITCH_IP, id=next(_ip_ids) if ip_id is None else ip_id,
                 ttl=64)
            / UDP(sport=job_udp_port(job), dport=BML_UDP_PORT, chksum=0)
            / BML(type=ptype, version=version, job_id=job, worker_id=worker, owner_id=owner,
                  slot=slot, exponent=exponent, count=width.blocks if count is None else count,
                  generation=generation, offset=offset)
            / values_layers(list(values), width.lanes))


def header_only(port: int, job: int, worker: int, ptype: int, slot: int = 0,
                version: int = 0, offset: int = 0, generation: int = 0, owner: int = 0,
                count: int | None = None):
    """A worker's header-only frame (a PROBE or a GENERATION question)."""
    return (Ether(dst=SWITCH_MAC, src=host_mac(port))
            / IP(src=host_ip(port), dst=SWITCH_IP, id=next(_ip_ids), ttl=64)
            / UDP(sport=job_udp_port(job), dport=BML_UDP_PORT, chksum=0)
            / BML(type=ptype, version=version, job_id=job, worker_id=worker, owner_id=owner,
                  slot=slot, count=blocks() if count is None else count,
                  generation=generation, offset=offset))


def probe(port: int, job: int, worker: int, slot: int = 0, version: int = 0, offset: int = 0,
          generation: int = 0, owner: int = 0, count: int | None = None):
    """A worker's header-only PROBE: is its contribution to this slot copy's use in? It
    copies the contribution's header, so ``count`` is the pipeline's blocks unless given."""
    return header_only(port, job, worker, PacketType.PROBE, slot, version, offset, generation,
                       owner, count)


def question(port: int, job: int, worker: int, generation: int = 0, count: int | None = None):
    """A worker's GENERATION question (header only): ``count`` its own blocks, any number."""
    return header_only(port, job, worker, PacketType.GENERATION, generation=generation,
                       count=count)


def from_switch(trigger, port: int, ptype: int, values=None, exponent: int | None = None,
                generation: int | None = None, count: int | None = None):
    """What the switch sends to the host on ``port`` in answer to ``trigger``: the trigger's
    IPv4 identification and BML fields, the switch's addresses, the given type and values
    (``None`` for a header-only ACK, GENERATION, PENDING or MISSING answer; PENDING and MISSING
    carry the copy's ``count``, a GENERATION answer the pipeline's blocks)."""
    bml = trigger[BML]
    header = BML(type=ptype, version=bml.version, job_id=bml.job_id, worker_id=bml.worker_id,
                 owner_id=bml.owner_id, slot=bml.slot,
                 exponent=bml.exponent if exponent is None else exponent,
                 count=(blocks() if ptype == PacketType.GENERATION else bml.count)
                 if count is None else count,
                 generation=bml.generation if generation is None else generation,
                 offset=bml.offset)
    # The switch writes fixed lengths (a trailer after the values travels along uncounted).
    udp_len = 8 + (_wire.payload_bytes if values is not None else HEADER_BYTES)
    packet = (Ether(dst=host_mac(port), src=SWITCH_MAC)
              / IP(src=SWITCH_IP, dst=host_ip(port), id=trigger[IP].id, ttl=64,
                   tos=trigger[IP].tos, flags=trigger[IP].flags, len=20 + udp_len)
              / UDP(sport=BML_UDP_PORT, dport=trigger[UDP].sport, chksum=0, len=udp_len)
              / header)
    if values is not None:
        packet = packet / values_layers(list(values), _wire.lanes)
    return packet


def wrap32(value: int) -> int:
    """int32 two's-complement wrap, as the switch's 32-bit adders do."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def lane_sums(*vectors) -> list[int]:
    return [wrap32(sum(column)) for column in zip(*vectors, strict=True)]
