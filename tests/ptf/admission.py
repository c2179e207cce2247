"""Admission: everything that is not an installed worker's sane contribution is dropped and
counted by reason, and leaves every sum untouched. A contribution of another width than the
pipeline's (its count is not the pipeline's blocks) is BAD_WIDTH, whatever its length."""

from __future__ import annotations

import random

import ptf.testutils as tu
from common.bml_test import (
    SWITCH,
    BmlTest,
    blocks,
    contribution,
    from_switch,
    lane_sums,
    lanes,
    other_width,
    probe,
    question,
)

from bml.protocol import DropReason, PacketType, Stat
from control_plane.aggregation import reset_frames

rng = random.Random(7)


def values() -> list[int]:
    return [rng.randint(-(1 << 20), 1 << 20) for _ in range(lanes())]


class DropCase:
    """Send one bad packet between two good contributions; the sum must be the good one."""

    reason: DropReason

    def bad_packet(self, good_values: list[int]):
        raise NotImplementedError

    def bad_port(self) -> int:
        """Worker 1's port: only the packet's own fault is the one under test."""
        return 2

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2], pool_size=8)
        a, b = values(), values()
        before = self.counters()
        self.send(1, contribution(1, 7, 0, a))
        self.send(self.bad_port(), self.bad_packet(b))
        tu.verify_no_other_packets(self)
        last = contribution(2, 7, 1, b)
        self.send(2, last)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, lane_sums(a, b)),
                             port)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 2, Stat.COMPLETED: 1}, {self.reason: 1})


class UnknownJob(DropCase, BmlTest):
    reason = DropReason.UNKNOWN_JOB

    def bad_packet(self, good):
        return contribution(2, 99, 1, good)


class ForgedWorkerId(DropCase, BmlTest):
    reason = DropReason.FORGED_WORKER

    def bad_packet(self, good):
        return contribution(2, 7, 5, good)


class WrongIngressPort(DropCase, BmlTest):
    """Worker 1's id, but sent from port 3, where worker 1 is not attached."""

    reason = DropReason.WRONG_PORT

    def bad_port(self) -> int:
        return 3

    def bad_packet(self, good):
        return contribution(3, 7, 1, good)


class ShortPacket(DropCase, BmlTest):
    reason = DropReason.SHORT_PACKET

    def bad_packet(self, good):
        return bytes(contribution(2, 7, 1, good))[:42 + 16 + 100]


class HeaderOnlyPacket(DropCase, BmlTest):
    reason = DropReason.SHORT_PACKET

    def bad_packet(self, good):
        return bytes(contribution(2, 7, 1, good))[:42 + 10]


class ProbeWithLanes(DropCase, BmlTest):
    """A PROBE is the header alone: one that carries lanes is not a probe the switch knows."""

    reason = DropReason.BAD_LENGTH

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, ptype=PacketType.PROBE)


class ProbeWithTrailer(DropCase, BmlTest):
    """Bytes after a probe's header: its lengths say header only, the frame does not."""

    reason = DropReason.BAD_LENGTH

    def bad_packet(self, good):
        return bytes(probe(2, 7, 1)) + bytes(8)


class GenerationQuestionWithLanes(DropCase, BmlTest):
    """A GENERATION question is the header alone, like a PROBE."""

    reason = DropReason.BAD_LENGTH

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, ptype=PacketType.GENERATION)


class CountNotTheWidth(DropCase, BmlTest):
    """A full frame of the pipeline's width whose count says other blocks."""

    reason = DropReason.BAD_WIDTH

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, count=blocks() + 1)


class ContributionOfAnotherWidth(DropCase, BmlTest):
    """A host of another build: its frame has its own length and its count its own blocks.
    Counted as a width mismatch, not as a short or overlong frame."""

    reason = DropReason.BAD_WIDTH

    def bad_packet(self, good):
        other = other_width()
        return contribution(2, 7, 1, (good * other.lanes)[:other.lanes], width=other)


class ProbeOfAnotherWidth(DropCase, BmlTest):
    """A PROBE copies its contribution's header: one of another width is refused as well."""

    reason = DropReason.BAD_WIDTH

    def bad_packet(self, good):
        return probe(2, 7, 1, count=other_width().blocks)


class BroadcastOfAnotherWidth(DropCase, BmlTest):
    reason = DropReason.BAD_WIDTH

    def bad_packet(self, good):
        other = other_width()
        return contribution(2, 7, 1, (good * other.lanes)[:other.lanes], width=other,
                            ptype=PacketType.BROADCAST)


class ResetOfAnotherWidth(BmlTest):
    """The controller's RESET of another width is refused before anything else: the slot
    keeps its partial sum (the round still completes with it)."""

    def runTest(self) -> None:  # noqa: N802
        group = self.add_job(7, [1, 2], pool_size=8)
        a, b = values(), values()
        self.send(1, contribution(1, 7, 0, a))
        before = self.counters()
        self.session.packet_out(reset_frames(SWITCH, group, other_width())[0])
        self.assert_counted(before, drops={DropReason.BAD_WIDTH: 1})
        last = contribution(2, 7, 1, b)
        self.send(2, last)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, lane_sums(a, b)),
                             port)
        tu.verify_no_other_packets(self)


class QuestionOfAnotherWidthAnswered(BmlTest):
    """A GENERATION question carries the asker's blocks, any number: it is answered all the
    same, with the pipeline's blocks in count, so a host of another width learns it at once."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2], pool_size=8)
        before = self.counters()
        for count in (other_width().blocks, 0, 255, blocks()):
            asked = question(2, 7, 1, generation=77, count=count)
            self.send(2, asked)
            tu.verify_packet(self, from_switch(asked, 2, PacketType.GENERATION, generation=0,
                                               count=blocks()), 2)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.GENERATION: 4})


class SlotOutsidePool(DropCase, BmlTest):
    reason = DropReason.BAD_SLOT

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, slot=8)


class UnknownType(DropCase, BmlTest):
    reason = DropReason.BAD_TYPE

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, ptype=PacketType.RESULT)


class BadVersion(DropCase, BmlTest):
    reason = DropReason.BAD_TYPE

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, version=2)


class ResetFromAPort(DropCase, BmlTest):
    """RESET is accepted only from the controller (CPU port); from a port it is forged."""

    reason = DropReason.FORGED_CONTROL

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, ptype=PacketType.RESET)


class StaleContribution(DropCase, BmlTest):
    """A contribution whose offset is not the one the slot copy is filling (a packet delayed
    past a reuse of its slot) is refused."""

    reason = DropReason.STALE

    def bad_packet(self, good):
        return contribution(2, 7, 1, good, offset=4096)
