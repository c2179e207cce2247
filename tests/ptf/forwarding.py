"""Plain forwarding: ordinary traffic goes by destination MAC; unknown destinations drop."""

from __future__ import annotations

import ptf.testutils as tu
from common.bml_test import BmlTest, host_ip, host_mac, mac_int
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether

from bml.protocol import DropReason, Stat
from control_plane.p4info import Names
from control_plane.session import entry


class ForwardByMac(BmlTest):
    def runTest(self) -> None:  # noqa: N802
        self.write(entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": mac_int(host_mac(4))},
                         Names.FORWARD_TO, port=4))
        before = self.counters()
        ping = (Ether(dst=host_mac(4), src=host_mac(1)) / IP(src=host_ip(1), dst=host_ip(4))
                / ICMP() / b"payload")
        self.send(1, ping)
        tu.verify_packet(self, ping, 4)
        other = (Ether(dst=host_mac(4), src=host_mac(2)) / IP(src=host_ip(2), dst=host_ip(4))
                 / UDP(sport=1234, dport=5678) / (b"x" * 100))
        self.send(2, other)
        tu.verify_packet(self, other, 4)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.FORWARDED: 2})


class UnknownDestinationDropped(BmlTest):
    def runTest(self) -> None:  # noqa: N802
        before = self.counters()
        self.send(1, Ether(dst=host_mac(7), src=host_mac(1)) / IP() / b"x")
        tu.verify_no_other_packets(self)
        self.assert_counted(before, drops={DropReason.NO_ROUTE: 1})
