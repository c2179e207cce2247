"""Frames the pipeline must not aggregate (docs/PROTOCOL.md, "Frames the pipeline does not
aggregate"): each case is a difference the differential test found, or one of the rules decided
with them, so that both targets are held to the same outcome.

Every bad frame below carries worker 1's own header and values on worker 1's own port, so if a
target looked inside it, worker 1's real contribution would then be a duplicate and the round's
result would come early or never: the good round after it checks that it did not.
"""

from __future__ import annotations

import ptf.testutils as tu
from admission import DropCase, values
from common.bml_test import (
    SWITCH,
    BmlTest,
    contribution,
    from_switch,
    host_ip,
    host_mac,
    lane_sums,
    mac_int,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
from scapy.packet import Raw

from bml.protocol import DropReason, PacketType, Stat
from control_plane.aggregation import reset_frames
from control_plane.p4info import Names
from control_plane.session import entry


def tagged(packet, dst: str | None = None, outer: bool = False) -> bytes:
    """``packet`` with an 802.1Q tag (and an 802.1ad outer tag) after the MAC addresses."""
    inner = packet[IP]
    ether = Ether(dst=dst or packet[Ether].dst, src=packet[Ether].src)
    if outer:
        return bytes(ether / Dot1AD(vlan=200) / Dot1Q(vlan=100) / inner)
    return bytes(ether / Dot1Q(vlan=100) / inner)


def edited_ip(packet, **fields) -> bytes:
    """``packet`` with IPv4 fields changed and its checksum recomputed."""
    copy = packet.copy()
    for name, value in fields.items():
        setattr(copy[IP], name, value)
    copy[IP].chksum = None
    return bytes(copy)


class VlanTagged(DropCase, BmlTest):
    """Found by the differential test: the software target looked inside a tagged frame (the
    kernel had taken the tag out); BMv2 does not parse past the tag. Ordinary traffic: to the
    switch's MAC there is no route."""

    reason = DropReason.NO_ROUTE

    def bad_packet(self, good):
        return tagged(contribution(2, 7, 1, good))


class DoubleTagged(DropCase, BmlTest):
    """802.1ad outer tag, 802.1Q inner tag: the same."""

    reason = DropReason.NO_ROUTE

    def bad_packet(self, good):
        return tagged(contribution(2, 7, 1, good), outer=True)


class Ipv4VersionNot4(DropCase, BmlTest):
    """Found by the differential test: BMv2 aggregated it and copied the version nibble into
    the results, the software target wrote 0x45. Now ordinary traffic on both."""

    reason = DropReason.NO_ROUTE

    def bad_packet(self, good):
        return edited_ip(contribution(2, 7, 1, good), version=6)


class Ipv4Options(DropCase, BmlTest):
    reason = DropReason.NO_ROUTE

    def bad_packet(self, good):
        packet = contribution(2, 7, 1, good)
        packet[IP].options = [b"\x01\x01\x01\x00"]  # NOP NOP NOP EOL
        packet[IP].ihl = packet[IP].len = packet[IP].chksum = None
        return bytes(packet)


class MoreFragments(DropCase, BmlTest):
    """The first fragment of a larger datagram (MF set, offset 0) was aggregated by both."""

    reason = DropReason.NO_ROUTE

    def bad_packet(self, good):
        return edited_ip(contribution(2, 7, 1, good), flags="MF")


class LaterFragment(DropCase, BmlTest):
    reason = DropReason.NO_ROUTE

    def bad_packet(self, good):
        return edited_ip(contribution(2, 7, 1, good), frag=37)


class NotUdp(DropCase, BmlTest):
    reason = DropReason.NO_ROUTE

    def bad_packet(self, good):
        return edited_ip(contribution(2, 7, 1, good), proto=6)


class UdpLengthDisagrees(DropCase, BmlTest):
    reason = DropReason.BAD_LENGTH

    def bad_packet(self, good):
        packet = contribution(2, 7, 1, good)
        packet[UDP].len = 8 + 16 + 64
        return bytes(packet)


class Ipv4LengthDisagrees(DropCase, BmlTest):
    reason = DropReason.BAD_LENGTH

    def bad_packet(self, good):
        return edited_ip(contribution(2, 7, 1, good), len=20 + 8 + self.wire.payload_bytes + 4)


class TrailingBytes(DropCase, BmlTest):
    """Bytes after the lanes (lengths right): both targets used to aggregate and send the
    tail along with the result; now refused."""

    reason = DropReason.BAD_LENGTH

    def bad_packet(self, good):
        return bytes(contribution(2, 7, 1, good)) + b"tail"


class ControllerFrameWithTrailingBytes(BmlTest):
    """A PacketOut carries 2 bytes of packet_out in front: its length check allows for them
    (a clean RESET works, install_group relies on it) and still refuses a tail."""

    def runTest(self) -> None:  # noqa: N802
        group = self.add_job(7, [1, 2])
        before = self.counters()
        self.session.packet_out(reset_frames(SWITCH, group, self.wire)[0] + b"tail")
        self.assert_counted(before, drops={DropReason.BAD_LENGTH: 1})
        self.reset_slot(group, 0)


class BadIpv4ChecksumIsNotChecked(BmlTest):
    """Decided, not found: the IPv4 checksum is not verified (the FCS guards the link); a
    contribution with a wrong one is aggregated like any other."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2])
        a, b = values(), values()
        before = self.counters()
        first = contribution(1, 7, 0, a)
        first[IP].chksum = 0x1234
        self.send(1, first)
        last = contribution(2, 7, 1, b)
        self.send(2, last)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, lane_sums(a, b)),
                             port)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 2, Stat.COMPLETED: 1})


class ForwardedByteForByte(BmlTest):
    """Ordinary traffic leaves as it came: a tagged aggregation packet keeps its tag and is
    not looked into; an IPv4 header with options keeps its (here deliberately wrong) checksum,
    which both targets used to rewrite over 20 bytes only."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 4])
        moved = contribution(1, 7, 0, values())
        moved[Ether].dst = host_mac(4)
        self.write(entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": mac_int(host_mac(4))},
                         Names.FORWARD_TO, port=4))
        before = self.counters()
        frames = [
            tagged(contribution(1, 7, 0, values()), dst=host_mac(4)),
            bytes(Ether(dst=host_mac(4), src=host_mac(1))
                  / IP(src=host_ip(1), dst=host_ip(4), options=[b"\x01\x01\x01\x00"],
                       chksum=0xBEEF)
                  / UDP(sport=1234, dport=5678) / Raw(b"x" * 40)),
            edited_ip(moved, version=5),
        ]
        for frame in frames:
            self.send(1, frame)
            tu.verify_packet(self, frame, 4)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.FORWARDED: 3})
