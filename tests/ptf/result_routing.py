"""Result routing: a completed sum to the job's members (or its chunk's owner, with ACKs to
the others), a broadcast to every other member, and a result with nowhere to go dropped."""

from __future__ import annotations

import random

import ptf.testutils as tu
from common.bml_test import BmlTest, contribution, from_switch, lane_sums, lanes

from bml.protocol import DropReason, PacketType, ResultMode, Stat

rng = random.Random(20261205)


def random_values() -> list[int]:
    """Values whose sums over a few workers stay inside int32."""
    return [rng.randint(-(1 << 27), (1 << 27) - 1) for _ in range(lanes())]


class ResultToOwner(BmlTest):
    """Reduce-scatter: the chunk's owner gets the sum, the other workers a header-only ACK."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2, 3], mode=ResultMode.TO_OWNER)
        vectors = [random_values() for _ in range(3)]
        for w in range(2):
            self.send(w + 1, contribution(w + 1, 9, w, vectors[w], owner=1))
        last = contribution(3, 9, 2, vectors[2], owner=1)
        self.send(3, last)
        tu.verify_packet(self, from_switch(last, 2, PacketType.RESULT, lane_sums(*vectors)), 2)
        tu.verify_packet(self, from_switch(last, 1, PacketType.ACK), 1)
        tu.verify_packet(self, from_switch(last, 3, PacketType.ACK), 3)
        tu.verify_no_other_packets(self)


class ResultMulticastToGroupOnly(BmlTest):
    """The multicast result reaches the job's members and no other port."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [2, 5])
        a, b = random_values(), random_values()
        self.send(2, contribution(2, 7, 0, a))
        last = contribution(5, 7, 1, b)
        self.send(5, last)
        tu.verify_packet(self, from_switch(last, 2, PacketType.RESULT, lane_sums(a, b)), 2)
        tu.verify_packet(self, from_switch(last, 5, PacketType.RESULT, lane_sums(a, b)), 5)
        tu.verify_no_other_packets(self)


class Broadcast(BmlTest):
    """A broadcast goes to every other member unchanged in its values, without aggregation."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3, 4])
        values = random_values()
        before = self.counters()
        packet = contribution(3, 7, 2, values, ptype=PacketType.BROADCAST, exponent=140)
        self.send(3, packet)
        for port in (1, 2, 4):
            tu.verify_packet(self, from_switch(packet, port, PacketType.BROADCAST, values), port)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.BROADCAST: 1})


class NoOwnerRoute(BmlTest):
    """In reduce-scatter mode a result for an owner with no route is dropped and counted."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2], mode=ResultMode.TO_OWNER)
        before = self.counters()
        self.send(1, contribution(1, 9, 0, random_values(), owner=6))
        self.send(2, contribution(2, 9, 1, random_values(), owner=6))
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 2, Stat.COMPLETED: 1},
                            {DropReason.NO_OWNER: 1})
