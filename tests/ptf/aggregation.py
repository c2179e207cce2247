"""Aggregation: sums, duplicates, retransmissions, probes, shadow copies, exponents."""

from __future__ import annotations

import random

import ptf.testutils as tu
from common.bml_test import (
    BmlTest,
    contribution,
    from_switch,
    lane_sums,
    lanes,
    probe,
    probe_answers_sum,
)

from bml.protocol import POOL_SLOTS, PacketType, ResultMode, Stat

rng = random.Random(20261202)


def random_values() -> list[int]:
    """Values whose sums over 8 workers stay inside int32 (no wrap expected)."""
    return [rng.randint(-(1 << 27), (1 << 27) - 1) for _ in range(lanes())]


class AggregationRound:
    """Every worker sends one contribution; the last one makes every worker get the sum."""

    workers = 2

    def runTest(self) -> None:  # noqa: N802 (unittest API)
        ports = list(range(1, self.workers + 1))
        self.add_job(7, ports)
        vectors = [random_values() for _ in ports]
        before = self.counters()
        packets = [contribution(port, 7, w, vectors[w], slot=3, offset=192)
                   for w, port in enumerate(ports)]
        for port, packet in zip(ports[:-1], packets[:-1], strict=True):
            self.send(port, packet)
        tu.verify_no_other_packets(self)
        self.send(ports[-1], packets[-1])
        total = lane_sums(*vectors)
        for port in ports:
            tu.verify_packet(self, from_switch(packets[-1], port, PacketType.RESULT, total), port)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: self.workers, Stat.COMPLETED: 1})


class TwoWorkers(AggregationRound, BmlTest):
    workers = 2


class ThreeWorkers(AggregationRound, BmlTest):
    workers = 3


class EightWorkers(AggregationRound, BmlTest):
    workers = 8


class SumsWrapLikeInt32(BmlTest):
    """The switch adds in 32 bits: sums past int32 wrap (the quantiser keeps them inside)."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2])
        big = [(1 << 31) - 1] * lanes()
        small = [1, -5] + [2] * (lanes() - 2)
        self.send(1, contribution(1, 7, 0, big))
        last = contribution(2, 7, 1, small)
        self.send(2, last)
        total = lane_sums(big, small)
        self.assertEqual(total[0], -(1 << 31))
        tu.verify_packet(self, from_switch(last, 1, PacketType.RESULT, total), 1)
        tu.verify_packet(self, from_switch(last, 2, PacketType.RESULT, total), 2)


class DuplicateIgnored(BmlTest):
    """A contribution sent twice before the slot completes is added once; the second copy is
    answered PENDING (header only, the count so far) to its sender only."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3])
        vectors = [random_values() for _ in range(3)]
        before = self.counters()
        self.send(1, contribution(1, 7, 0, vectors[0]))
        again = contribution(1, 7, 0, vectors[0])
        self.send(1, again)
        tu.verify_packet(self, from_switch(again, 1, PacketType.PENDING, count=1), 1)
        self.send(2, contribution(2, 7, 1, vectors[1]))
        tu.verify_no_other_packets(self)
        last = contribution(3, 7, 2, vectors[2])
        self.send(3, last)
        total = lane_sums(*vectors)
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, total), port)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 3, Stat.COMPLETED: 1, Stat.PENDING: 1})


class PendingToSenderOnly(BmlTest):
    """Re-sends into a copy that still waits for others: each is answered PENDING to its own
    sender, header only, with the copy's count so far (the re-send's values, exponent and
    owner change nothing); the other workers get nothing. Once the copy completes, the same
    re-send gets the stored sum (RESULT_RETX), to that worker only."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3, 4])
        vectors = [random_values() for _ in range(4)]
        sent = [contribution(w + 1, 7, w, vectors[w], slot=6, version=1, offset=640,
                             exponent=130 + w, generation=3) for w in range(4)]
        before = self.counters()
        self.send(1, sent[0])
        self.send(3, sent[2])
        tu.verify_no_other_packets(self)
        resend = contribution(3, 7, 2, random_values(), slot=6, version=1, offset=640,
                              exponent=200, generation=3)
        self.send(3, resend)
        tu.verify_packet(self, from_switch(resend, 3, PacketType.PENDING, count=2), 3)
        tu.verify_no_other_packets(self)
        self.send(2, sent[1])
        tu.verify_no_other_packets(self)
        self.send(1, sent[0])
        tu.verify_packet(self, from_switch(sent[0], 1, PacketType.PENDING, count=3), 1)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 3, Stat.PENDING: 2})
        self.send(4, sent[3])
        total = lane_sums(*vectors)
        for port in (1, 2, 3, 4):
            tu.verify_packet(self, from_switch(sent[3], port, PacketType.RESULT, total,
                                               exponent=133), port)
        tu.verify_no_other_packets(self)
        self.send(3, resend)
        tu.verify_packet(self, from_switch(resend, 3, PacketType.RESULT_RETX, total,
                                           exponent=133), 3)
        tu.verify_no_other_packets(self)


class PendingOnToOwnerJob(BmlTest):
    """On a reduce-scatter (TO_OWNER) job a re-send into the filling copy is answered PENDING
    to its sender, owner or not (never an ACK, and no owner route needed); a duplicate whose
    offset is not the copy's is still ignored, silently."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2, 3], mode=ResultMode.TO_OWNER)
        values = random_values()
        before = self.counters()
        self.send(1, contribution(1, 9, 0, values, owner=2, slot=2, offset=128))
        again = contribution(1, 9, 0, values, owner=31, slot=2, offset=128)
        self.send(1, again)
        tu.verify_packet(self, from_switch(again, 1, PacketType.PENDING, count=1), 1)
        self.send(1, contribution(1, 9, 0, values, owner=2, slot=2, offset=192))
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 1, Stat.PENDING: 1, Stat.DUPLICATE: 1})


class ProbeAnsweredByTheCopysState(BmlTest):
    """A PROBE (header only) asks whether its sender's contribution is in the copy: PENDING
    while the copy fills and it is in, MISSING (with the count so far) when it is not; once
    the copy is complete the stored sum where it fits an answer (up to 128 lanes), MISSING
    with the count wider; each to the prober only, and no probe ever changes a sum."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3])
        vectors = [random_values() for _ in range(3)]
        sent = [contribution(w + 1, 7, w, vectors[w], slot=4, version=1, offset=256,
                             generation=2) for w in range(3)]
        before = self.counters()
        self.send(1, sent[0])
        asked = probe(1, 7, 0, slot=4, version=1, offset=256, generation=2)
        self.send(1, asked)
        tu.verify_packet(self, from_switch(asked, 1, PacketType.PENDING, count=1), 1)
        lost = probe(2, 7, 1, slot=4, version=1, offset=256, generation=2)
        self.send(2, lost)
        tu.verify_packet(self, from_switch(lost, 2, PacketType.MISSING, count=1), 2)
        tu.verify_no_other_packets(self)
        self.send(2, sent[1])
        self.send(3, sent[2])
        total = lane_sums(*vectors)
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(sent[2], port, PacketType.RESULT, total), port)
        answered = probe(3, 7, 2, slot=4, version=1, offset=256, generation=2)
        self.send(3, answered)
        counted = {Stat.AGGREGATED: 3, Stat.COMPLETED: 1, Stat.PENDING: 1, Stat.MISSING: 1}
        if probe_answers_sum():
            tu.verify_packet(self, from_switch(answered, 3, PacketType.RESULT_RETX, total), 3)
            counted[Stat.RETX_ANSWERED] = 1
        else:
            tu.verify_packet(self, from_switch(answered, 3, PacketType.MISSING, count=3), 3)
            counted[Stat.MISSING] += 1
        tu.verify_no_other_packets(self)
        self.assert_counted(before, counted)


class ProbeOnToOwnerJob(BmlTest):
    """On a reduce-scatter job a probe into the completed copy gets the sum if its sender owns
    the chunk, a header-only ACK if not: what a re-sent contribution would get. Where the sum
    does not fit an answer to a probe (more than 128 lanes) both get MISSING with the count,
    and the full frames re-sent then get the sum and the ACK."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(9, [1, 2], mode=ResultMode.TO_OWNER)
        vectors = [random_values() for _ in range(2)]
        self.send(1, contribution(1, 9, 0, vectors[0], owner=1, slot=1, offset=64))
        last = contribution(2, 9, 1, vectors[1], owner=1, slot=1, offset=64)
        self.send(2, last)
        total = lane_sums(*vectors)
        tu.verify_packet(self, from_switch(last, 2, PacketType.RESULT, total), 2)
        tu.verify_packet(self, from_switch(last, 1, PacketType.ACK), 1)
        owner = probe(2, 9, 1, slot=1, offset=64, owner=1)
        other = probe(1, 9, 0, slot=1, offset=64, owner=1)
        if not probe_answers_sum():
            for port, asked in ((2, owner), (1, other)):
                self.send(port, asked)
                tu.verify_packet(self, from_switch(asked, port, PacketType.MISSING, count=2),
                                 port)
            tu.verify_no_other_packets(self)
            owner = contribution(2, 9, 1, vectors[1], owner=1, slot=1, offset=64)
            other = contribution(1, 9, 0, vectors[0], owner=1, slot=1, offset=64)
        self.send(2, owner)
        tu.verify_packet(self, from_switch(owner, 2, PacketType.RESULT_RETX, total), 2)
        self.send(1, other)
        tu.verify_packet(self, from_switch(other, 1, PacketType.ACK), 1)
        tu.verify_no_other_packets(self)


class ProbeOfACompleteWideCopyThenTheFrame(BmlTest):
    """No answer is larger than its question by more than 512 bytes. Up to 128 lanes a probe
    into its completed copy gets the stored sum; wider it gets MISSING (header only, the count),
    and the full frame the worker then re-sends gets RESULT_RETX with the sum, to it only.
    Neither changes the sum."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3])
        vectors = [random_values() for _ in range(3)]
        packets = [contribution(w + 1, 7, w, vectors[w], slot=6, offset=384, generation=5)
                   for w in range(3)]
        for w, packet in enumerate(packets):
            self.send(w + 1, packet)
        total = lane_sums(*vectors)
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(packets[-1], port, PacketType.RESULT, total),
                             port)
        before = self.counters()
        asked = probe(2, 7, 1, slot=6, offset=384, generation=5)
        self.send(2, asked)
        if probe_answers_sum():
            tu.verify_packet(self, from_switch(asked, 2, PacketType.RESULT_RETX, total), 2)
            counted = {Stat.RETX_ANSWERED: 2}
        else:
            tu.verify_packet(self, from_switch(asked, 2, PacketType.MISSING, count=3), 2)
            counted = {Stat.MISSING: 1, Stat.RETX_ANSWERED: 1}
        tu.verify_no_other_packets(self)
        resend = contribution(2, 7, 1, vectors[1], slot=6, offset=384, generation=5)
        self.send(2, resend)
        tu.verify_packet(self, from_switch(resend, 2, PacketType.RESULT_RETX, total), 2)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, counted)


class RetransmissionAfterCompletion(BmlTest):
    """A worker that missed the result re-sends; only it gets the stored sum back."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3])
        vectors = [random_values() for _ in range(3)]
        packets = [contribution(w + 1, 7, w, vectors[w], slot=5, offset=320) for w in range(3)]
        for w, packet in enumerate(packets):
            self.send(w + 1, packet)
        total = lane_sums(*vectors)
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(packets[-1], port, PacketType.RESULT, total),
                             port)
        before = self.counters()
        resend = contribution(2, 7, 1, vectors[1], slot=5, offset=320)
        self.send(2, resend)
        tu.verify_packet(self, from_switch(resend, 2, PacketType.RESULT_RETX, total), 2)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.RETX_ANSWERED: 1})


class ShadowCopiesAndSlotReuse(BmlTest):
    """Version 0 and 1 of a slot hold separate sums; reusing a copy starts from zero."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2])
        for use, version in enumerate((0, 1, 0, 1)):
            a, b = random_values(), random_values()
            offset = use * lanes()
            self.send(1, contribution(1, 7, 0, a, slot=2, version=version,
                                                 offset=offset))
            last = contribution(2, 7, 1, b, slot=2, version=version, offset=offset)
            self.send(2, last)
            total = lane_sums(a, b)
            for port in (1, 2):
                tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, total), port)
            tu.verify_no_other_packets(self)


class OtherCopyStillAnswers(BmlTest):
    """While copy 1 fills, a worker that missed copy 0's result still gets it."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2])
        a0, b0, a1 = random_values(), random_values(), random_values()
        self.send(1, contribution(1, 7, 0, a0, version=0, offset=0))
        last = contribution(2, 7, 1, b0, version=0, offset=0)
        self.send(2, last)
        for port in (1, 2):  # copy 0's result, which worker 1 (port 2) then says it missed
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, lane_sums(a0, b0)),
                             port)
        self.send(1, contribution(1, 7, 0, a1, version=1, offset=64))
        resend = contribution(2, 7, 1, b0, version=0, offset=0)
        self.send(2, resend)
        tu.verify_packet(self, from_switch(resend, 2, PacketType.RESULT_RETX,
                                           lane_sums(a0, b0)), 2)
        tu.verify_no_other_packets(self)


class LateCopyAfterMovingOn(BmlTest):
    """Found while writing the differential test (the same on both targets): a late copy of
    a worker's contribution to a completed round, arriving after that worker moved on to the
    other copy (a retransmission overtaken in the network), was added again and took the
    worker's bit out of the round it is now in, so its re-send there was added twice and the
    group got a wrong sum. Now it is a duplicate: the next round's sum is right."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3])
        round0 = [random_values() for _ in range(3)]
        sent0 = [contribution(w + 1, 7, w, round0[w], slot=1, offset=0) for w in range(3)]
        for w, packet in enumerate(sent0):
            self.send(w + 1, packet)
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(sent0[-1], port, PacketType.RESULT,
                                               lane_sums(*round0)), port)
        round1 = [random_values() for _ in range(3)]
        sent1 = [contribution(w + 1, 7, w, round1[w], slot=1, version=1, offset=64)
                 for w in range(3)]
        before = self.counters()
        self.send(1, sent1[0])  # worker 0 moves on, then worker 2
        self.send(3, sent1[2])
        self.send(1, contribution(1, 7, 0, round0[0], slot=1, offset=0))  # late
        tu.verify_no_other_packets(self)
        self.send(1, sent1[0])  # worker 0 re-sends: it is in, still PENDING
        tu.verify_packet(self, from_switch(sent1[0], 1, PacketType.PENDING, count=2), 1)
        tu.verify_no_other_packets(self)
        self.send(2, sent1[1])
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(sent1[1], port, PacketType.RESULT,
                                               lane_sums(*round1)), port)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 3, Stat.DUPLICATE: 1, Stat.PENDING: 1,
                                     Stat.COMPLETED: 1})


class MaxExponent(BmlTest):
    """The result carries the largest exponent any worker announced."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2, 3])
        vectors = [random_values() for _ in range(3)]
        exponents = [130, 151, 0]
        for w in range(2):
            self.send(w + 1, contribution(w + 1, 7, w, vectors[w],
                                                     exponent=exponents[w]))
        last = contribution(3, 7, 2, vectors[2], exponent=exponents[2])
        self.send(3, last)
        for port in (1, 2, 3):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT,
                                               lane_sums(*vectors), exponent=151), port)


class TwoJobsIsolated(BmlTest):
    """Two jobs using the same slot numbers, interleaved, each get only their own sums."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(1, [1, 2], pool_base=0)
        self.add_job(2, [3, 4], pool_base=16)
        a1, b1, a2, b2 = (random_values() for _ in range(4))
        self.send(1, contribution(1, 1, 0, a1, slot=4))
        self.send(3, contribution(3, 2, 0, a2, slot=4))
        last2 = contribution(4, 2, 1, b2, slot=4)
        self.send(4, last2)
        tu.verify_packet(self, from_switch(last2, 3, PacketType.RESULT, lane_sums(a2, b2)), 3)
        tu.verify_packet(self, from_switch(last2, 4, PacketType.RESULT, lane_sums(a2, b2)), 4)
        tu.verify_no_other_packets(self)
        last1 = contribution(2, 1, 1, b1, slot=4)
        self.send(2, last1)
        tu.verify_packet(self, from_switch(last1, 1, PacketType.RESULT, lane_sums(a1, b1)), 1)
        tu.verify_packet(self, from_switch(last1, 2, PacketType.RESULT, lane_sums(a1, b1)), 2)
        tu.verify_no_other_packets(self)


class ResetThroughPacketOut(BmlTest):
    """A RESET from the controller empties a half-filled slot: the next round starts fresh."""

    def runTest(self) -> None:  # noqa: N802
        group = self.add_job(7, [1, 2])
        stale = random_values()
        self.send(1, contribution(1, 7, 0, stale))
        self.reset_slot(group, 0)
        a, b = random_values(), random_values()
        self.send(1, contribution(1, 7, 0, a))
        last = contribution(2, 7, 1, b)
        self.send(2, last)
        for port in (1, 2):
            tu.verify_packet(self, from_switch(last, port, PacketType.RESULT, lane_sums(a, b)),
                             port)


class PoolPastTheRegisters(BmlTest):
    """Found by differential probing: a job whose pool runs past the register arrays (only a
    control plane that does not check installs one) crashed the software target, while BMv2
    reads 0 there and ignores the writes. Both now: past the arrays nothing is remembered, so
    every contribution is aggregated alone, a re-send is no duplicate, only a one-worker job
    completes (with its own values); inside the arrays the same pool works as ever."""

    def runTest(self) -> None:  # noqa: N802
        self.add_job(7, [1, 2], pool_base=POOL_SLOTS - 4, pool_size=16)  # slots 4.. are past
        self.add_job(8, [3], pool_base=POOL_SLOTS - 4, pool_size=16)
        a, b = random_values(), random_values()
        before = self.counters()
        first = contribution(1, 7, 0, a, slot=9)
        self.send(1, first)
        self.send(1, first)
        self.send(2, contribution(2, 7, 1, b, slot=9))
        tu.verify_no_other_packets(self)
        alone = contribution(3, 8, 0, b, slot=12, exponent=130)
        self.send(3, alone)
        tu.verify_packet(self, from_switch(alone, 3, PacketType.RESULT, b), 3)
        tu.verify_no_other_packets(self)
        self.assert_counted(before, {Stat.AGGREGATED: 4, Stat.COMPLETED: 1})
        inside = [contribution(1, 7, 0, a, slot=3), contribution(2, 7, 1, b, slot=3)]
        self.send(1, inside[0])
        self.send(2, inside[1])
        for port in (1, 2):
            tu.verify_packet(self, from_switch(inside[1], port, PacketType.RESULT,
                                               lane_sums(a, b)), port)
        tu.verify_no_other_packets(self)
