"""The P4Runtime side of the target, as PI serves it for BMv2 (each found by sending the same
writes to both targets): default entries, and which writes are refused with which code."""

from __future__ import annotations

import ptf.testutils as tu
from common.bml_test import SWITCH_MAC, BmlTest, host_mac, mac_int
from p4.v1 import p4runtime_pb2
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from bml.protocol import DropReason, Stat
from control_plane.p4info import Names
from control_plane.session import entry

NO_ROUTE = "BmlIngress.forwarding.no_route"


class DefaultEntryOfL2Forward(BmlTest):
    """l2_forward's default is no_route until a controller MODIFYs it: forward_to(4) sends
    unknown destinations to port 4 (the software target refused every default write); a
    MODIFY without an action puts the program's default back. INSERT and DELETE of a default
    entry are refused; reading it returns it alone."""

    def default(self, action: str | None, **params: int) -> p4runtime_pb2.TableEntry:
        table_entry = p4runtime_pb2.TableEntry(
            table_id=self.session.p4info.table(Names.L2_FORWARD).id, is_default_action=True)
        if action is not None:
            table_entry.action.action.CopyFrom(self.session.table_entry(
                entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": 0}, action, **params))
                .action.action)
        return table_entry

    def read_default(self) -> list[p4runtime_pb2.TableEntry]:
        entity = p4runtime_pb2.Entity()
        entity.table_entry.table_id = self.session.p4info.table(Names.L2_FORWARD).id
        entity.table_entry.is_default_action = True
        return [e.table_entry for e in self.session._read(entity)]

    def runTest(self) -> None:  # noqa: N802
        unknown = Ether(dst="02:aa:00:00:00:99", src=host_mac(1), type=0x0806) / Raw(bytes(28))
        self.assertEqual(self.write_code("INSERT", self.default(Names.FORWARD_TO, port=4)),
                         "INVALID_ARGUMENT")
        try:
            before = self.counters()
            self.assertEqual(self.write_code("MODIFY", self.default(Names.FORWARD_TO, port=4)),
                             "OK")
            (stored,) = self.read_default()
            self.assertTrue(stored.is_default_action)
            self.assertEqual(stored.action.action.params[0].value, b"\x04")
            self.send(1, unknown)
            tu.verify_packet(self, unknown, 4)
            tu.verify_no_other_packets(self)
            self.assert_counted(before, {Stat.FORWARDED: 1})
        finally:
            self.assertEqual(self.write_code("MODIFY", self.default(None)), "OK")
        self.assertEqual(self.read_default()[0].action.action.action_id,
                         self.session.p4info.action(NO_ROUTE).id)
        self.assertEqual(self.write_code("DELETE", self.default(None)), "INVALID_ARGUMENT")
        before = self.counters()
        self.send(1, unknown)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, drops={DropReason.NO_ROUTE: 1})


class WritesRefusedAsPiRefusesThem(BmlTest):
    """A value wider than its field is INVALID_ARGUMENT (the software target said
    OUT_OF_RANGE), an empty one is read as 0, a priority on an exact table and a replica given
    twice are refused (the software target took them)."""

    def runTest(self) -> None:  # noqa: N802
        route = self.session.table_entry(entry(
            Names.L2_FORWARD, {"hdr.ethernet.dstAddr": mac_int(SWITCH_MAC) + 1},
            Names.FORWARD_TO, port=3))
        wide = p4runtime_pb2.TableEntry()
        wide.CopyFrom(route)
        wide.action.action.params[0].value = (600).to_bytes(2, "big")  # port_t is 9 bits
        self.assertEqual(self.write_code("INSERT", wide), "INVALID_ARGUMENT")
        with_priority = p4runtime_pb2.TableEntry()
        with_priority.CopyFrom(route)
        with_priority.priority = 5
        self.assertEqual(self.write_code("INSERT", with_priority), "INVALID_ARGUMENT")
        empty = p4runtime_pb2.TableEntry()
        empty.CopyFrom(route)
        empty.action.action.params[0].value = b""
        self.assertEqual(self.write_code("INSERT", empty), "OK")
        self.assertEqual(self.write_code("DELETE", route), "OK")  # the same entry: port 0
        twice = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=77)
        twice.replicas.add(egress_port=2, instance=0)
        twice.replicas.add(egress_port=2, instance=0)
        self.assertEqual(self.write_code("INSERT", group=twice), "INVALID_ARGUMENT")
