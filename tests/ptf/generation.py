"""Generations: a newer call abandons what an aborted one left; an older call's contributions
are answered with the job's generation, never added; a late copy stays a duplicate even after
every worker moved on."""

from __future__ import annotations

import random

import ptf.testutils as tu
from common.bml_test import BmlTest, blocks, contribution, from_switch, lane_sums, lanes, question

from bml.protocol import PacketType, ResultMode, Stat

rng = random.Random(20261203)


def random_values() -> list[int]:
    return [rng.randint(-(1 << 27), (1 << 27) - 1) for _ in range(lanes())]


class QueryAnsweredToSenderOnly(BmlTest):
    """A worker asks which generation its job is at (header only): only it gets the answer,
    header only, with the pipeline's blocks in count; a job set up afresh is at generation 0."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2])
        before = self.counters()
        query = question(2, 9, 1, generation=1234)
        self.send(2, query)
        tu.verify_packet(self, from_switch(query, 2, PacketType.GENERATION, generation=0,
                                           count=blocks()), 2)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.GENERATION: 1})


class NewerCallAbandonsLeftovers(BmlTest):
    """A call aborted after worker 0 contributed (generation 4); the next call (generation 5)
    by both workers sums only its own values, on the same slot, copy and offset."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2])
        leftover = random_values()
        self.send(1, contribution(1, 9, 0, leftover, slot=3, generation=4))
        tu.verify_no_other_packets(self)
        a, b = random_values(), random_values()
        before = self.counters()
        self.send(1, contribution(1, 9, 0, a, slot=3, generation=5))
        last = contribution(2, 9, 1, b, slot=3, generation=5)
        self.send(2, last)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, lane_sums(a, b)),
                             port)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 2, Stat.COMPLETED: 1})


class OlderCallAnsweredNotAdded(BmlTest):
    """A worker still in an older call (generation 6) contributes into a slot the newer call
    (generation 7) fills: it gets the job's generation back, and the newer call's sum is
    unchanged. Its query then also says 7."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2, 3])
        fresh = [random_values() for _ in range(3)]
        self.send(1, contribution(1, 9, 0, fresh[0], slot=2, generation=7))
        tu.verify_no_other_packets(self)
        before = self.counters()
        old = contribution(2, 9, 1, random_values(), slot=2, generation=6)
        self.send(2, old)
        tu.verify_packet(self, from_switch(old, 2, PacketType.GENERATION, generation=7), 2)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.OLD_CALL: 1})
        self.send(2, contribution(2, 9, 1, fresh[1], slot=2, generation=7))
        last = contribution(3, 9, 2, fresh[2], slot=2, generation=7)
        self.send(3, last)
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT,
                                               lane_sums(*fresh)), port)
        tu.verify_no_other_packets(self)


class GenerationsWrapAround(BmlTest):
    """Generations compare as 16-bit serial numbers: a job set up at 0 moves up by newer calls
    (each less than half the circle ahead) to 65535; 0 then follows it (newer: its call
    starts the copy afresh and sums), and 65535 is then older."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2])
        before = self.counters()
        for generation in (0x7FFF, 0xFFFE, 0xFFFF):  # each newer: it starts the copy afresh
            self.send(1, contribution(1, 9, 0, random_values(), slot=1, generation=generation))
        tu.verify_no_other_packets(self)
        a, b = random_values(), random_values()
        self.send(1, contribution(1, 9, 0, a, slot=1, generation=0))
        last = contribution(2, 9, 1, b, slot=1, generation=0)
        self.send(2, last)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, lane_sums(a, b)),
                             port)
        old = contribution(2, 9, 1, b, slot=1, version=1, offset=64, generation=0xFFFF)
        self.send(2, old)
        tu.verify_packet(self, from_switch(old, 2, PacketType.GENERATION, generation=0), 2)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 5, Stat.COMPLETED: 1, Stat.OLD_CALL: 1})


class GenerationAnswerOnToOwnerJob(BmlTest):
    """On a reduce-scatter (TO_OWNER) job the answer is still a GENERATION packet to the
    sender, not an ACK."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2], mode=ResultMode.TO_OWNER)
        self.send(1, contribution(1, 9, 0, random_values(), owner=1,
                                             generation=3))
        old = contribution(2, 9, 1, random_values(), owner=1, generation=2)
        self.send(2, old)
        tu.verify_packet(self, from_switch(old, 2, PacketType.GENERATION, generation=3), 2)
        tu.verify_no_other_packets(self)


class LateCopyAfterEveryoneMovedOn(BmlTest):
    """A late copy of a completed round that arrives after *every* worker moved on to the
    other copy (the copy's bitmap is empty then) is a duplicate: it neither starts the copy
    afresh nor blocks the copy's next use."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2])
        round0 = [random_values(), random_values()]
        sent0 = [contribution(w + 1, 9, w, round0[w], slot=4, offset=0, generation=1)
                 for w in range(2)]
        for w, packet in enumerate(sent0):
            self.send(w + 1, packet)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(sent0[-1], port, PacketType.RESULT,
                                               lane_sums(*round0)), port)
        round1 = [random_values(), random_values()]
        sent1 = [contribution(w + 1, 9, w, round1[w], slot=4, version=1, offset=64,
                              generation=1) for w in range(2)]
        for w, packet in enumerate(sent1):  # both move on to copy 1
            self.send(w + 1, packet)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(sent1[-1], port, PacketType.RESULT,
                                               lane_sums(*round1)), port)
        before = self.counters()
        self.send(1, sent0[0])  # the late copy
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.DUPLICATE: 1})
        round2 = [random_values(), random_values()]
        sent2 = [contribution(w + 1, 9, w, round2[w], slot=4, offset=128, generation=1)
                 for w in range(2)]
        for w, packet in enumerate(sent2):
            self.send(w + 1, packet)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(sent2[-1], port, PacketType.RESULT,
                                               lane_sums(*round2)), port)
        tu.verify_no_other_packets(self)
