"""Loss recovery for switch slots, without I/O: one set of rules for every executor.

A worker keeps a window of a switch job's slots in flight (``SlotWindow``); every frame is
answered by the switch (a RESULT, an ACK, or PENDING: "your contribution is in, the copy waits
for the others"). This module decides, from answers and ``now`` alone, when a slot's frame is
presumed lost and re-sent, and how many re-sends a NIC may spend (``NicState``,
``resend_overdue``). The BCube call's ``SwitchChannel`` (``hosts/call.py``) and the one-NIC
call (``hosts/single.py``) are both ``SlotWindow``s: they say what a slot's next frame holds
and what an answer means; when to send again is decided here, once.

What to send again is decided here too. A slot waits as often for a co-worker's lost
contribution as for this worker's, and from here the two look alike; so the first recovery of
a use is a header-only PROBE (a fifth of the frame), which the switch answers with the sum
(RESULT_RETX), PENDING (in; the copy waits for the others) or MISSING (lost: the frame goes
again at once). A probe with no answer is followed by the frame itself, and so on in turn.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from bml.protocol import probe_of

RTO_SAMPLES = 64  # answer times the timeout is estimated from
RTO_QUANTILE = 0.5  # the quantile of those that is an answer's time without loss
RTO_QUANTILES = 2.0  # the timeout, in that quantile
RTO_INITIAL = 0.05  # s, before any answer
# The least timeout, and the least where few of a window's frames are presumed in its link's
# queue (at most TAIL_FRAMES of the frames in flight): a call's tail, where the last slots'
# uses go one at a time over an idle link and each loss among them costs a timeout (star:4,
# 500K floats, 5% loss, 20 Mbit/s: 0.72 of the lossless goodput with 20 ms there, 0.77 with
# 5 ms in the simulator). Not with a queue of frames: a software switch that a loaded host
# deschedules for 20 ms pauses every answer, and with the 5 ms floor mid-call a worker took
# that for a stall and probed every slot, which loaded the switch more (star:4, 4M floats,
# no loss: 17-18 s instead of 10, one worker probing all 65,536 uses).
RTO_FLOOR = 0.02
TAIL_RTO_FLOOR = 0.005
TAIL_FRAMES = 1 / 8
# Timer scans (``overdue`` walks every slot of every window) at most this often.
SCAN_LEAST = 0.005

RETX_PER_ANSWER = 0.5  # re-send budget a NIC earns per answered slot
RETX_BUDGET_CAP = 64.0
# What a PROBE costs of that budget: its share of a 64-lane frame's bytes. Probes are cheap,
# not free: a window of slots waiting for a lagging co-worker, each asked every timeout, sent
# more bytes than the call's data on 2 Mbit/s links (bcube:3,2, busiest NIC 1.6x its bytes).
PROBE_COST = 0.1
# A slot the switch answered PENDING (this worker's contribution is in, the copy waits for
# others) is asked again (a PROBE: header only, so cheap) this many timeouts after the
# PENDING: only if the final answer is lost on its way does the switch need to hear from this
# worker again, and then every timeout waited holds the slot, and the co-workers' next use of
# it, for nothing. After PENDING_PATIENCE answers PENDING to the same use the others are
# late, not lost (a frozen or dead co-worker): the wait doubles, up to 8 times, so that a
# window of waiting slots does not flood the switch with probes until the call's timeout.
PENDING_FALLBACK = 1
PENDING_PATIENCE = 4
OUT_OF_ORDER_WAIT = 3  # timeouts RACK's evidence waits where members send in their own orders
# Timeouts without any answer before a window that still has uses to send presumes its
# frames in flight lost. Mid-call a loss shows as a later frame answered first (RACK's rule);
# a window all of whose answers pause is mostly waiting behind its NIC's down link, busy
# with the neighbours' broadcasts and streams. At a window's end no later frame can give
# that evidence, and one timeout is the rule; so too where few of the window's frames are in
# the queue (a slot that its recoveries left uses behind the others, which have finished:
# with 128 frames in flight, one such slot waited four timeouts at every loss of its last
# uses and ended a simulated 500K call at 1% loss 0.6 s late).
MID_CALL_STALL = 4
# A switch is presumed down within about a second plus a few answer times: SWITCH_SILENCE
# without a frame from it, then SWITCH_DEADLINE without an answer to a question whether it
# is alive (both grow with the answer times the NIC sees, so a loaded link's queue is not
# taken for a dead switch).
SWITCH_SILENCE = 0.5
SWITCH_DEADLINE = 0.5
# ... before this NIC has seen any slot answered (a fresh process, or a call re-planned:
# ``NicState.restart``) while slots wait: a slow
# switch (BMv2's default build) may take seconds to work through the first window of every
# member.
FIRST_ANSWER_DEADLINE = 10.0
# ... and on a NIC that sends the switch no slots (host-to-host streams only, host-based
# BML), so knows no answer time. The streams the switch forwards are its signs of life
# (``NicState.delivered``), so a question goes out only once they too have paused: then no
# stream fills the down queue ahead of the answer.
QUIET_NIC_DEADLINE = 1.0
# ... and in the exponent exchange before any answer time is known (a fresh process): the
# heaviest moment of a loaded host, every worker process starting and quantising at once.
# BMv2's default build, four switches beside four workers on two cores, was silent there
# for 1.5-1.9 s, four questions unanswered (bcube:2,2 re-planning test, with a busy loop
# beside: in 5 of its 21 runs).
START_DEADLINE = 3.0
# The least wait for a GENERATION answer at the mesh's start timeout (``Engine``): other
# workers may still be draining a previous call's frames through the switch.
CONNECT_QUESTION_WAIT = 1.5
GENERATION_ASK_EVERY = 0.05  # s between GENERATION questions at a call's start: a lost one's cost
# A worker that still misses blocks says so (a HERE) to a neighbour that said DONE and that
# it has sent nothing else for this long: a neighbour that holds the whole sum and hears
# nothing from it for a failure's detection time takes it for gone (``Call._watch_neighbours``).
HEARTBEAT_EVERY = SWITCH_SILENCE / 2


@dataclass
class Rto:
    """Retransmission timeout from answer-time samples (Karn's rule by the caller); each slot's
    back-off on top of it is ``SlotWindow.overdue``'s.

    An aggregation slot's answer waits for every worker's contribution, so its time includes
    the other workers' recoveries from their own losses: under loss the slow part of the
    samples is other workers' re-sends, not the network (at 10% loss each way, half of a
    4-worker slot's uses wait for one). TCP's mean + 4 deviations would follow that up (and
    every re-send would then wait longer, making the samples longer still, up to the cap).
    A low quantile of the recent samples is what an answer takes when nothing was lost;
    ``RTO_QUANTILES`` times it is the timeout."""

    floor: float = 0.01
    cap: float = 5.0
    samples: deque = field(default_factory=lambda: deque(maxlen=RTO_SAMPLES))
    base: float = RTO_INITIAL
    _fresh: int = 0

    @property
    def value(self) -> float:
        return min(self.cap, max(self.floor, self.base))

    def sample(self, rtt: float) -> None:
        self.samples.append(rtt)
        self._fresh += 1
        if self._fresh >= 8 or len(self.samples) < 8:  # re-estimated every 8 samples
            self._fresh = 0
            ordered = sorted(self.samples)
            self.base = RTO_QUANTILES * ordered[int(RTO_QUANTILE * (len(ordered) - 1))]


@dataclass
class NicState:
    """One NIC's state a worker keeps across calls: its answer-time estimate, its re-send
    budget, and what the switch watch knows.

    A slot's answer waits for every member of its group, so a late answer often means a slow
    neighbour or a full queue, not a loss; re-sending then only lengthens the queues, and on a
    loaded machine every re-send makes the next one likelier. So re-sends are clocked by
    answers (like TCP's ACK clock): each answered slot earns ``RETX_PER_ANSWER`` re-sends, and
    with the budget spent only the longest-waiting slot is re-sent, once per RTO. The switch
    tells a re-send into a copy that already holds this worker's contribution (``PENDING``):
    that re-send is refunded (the slot then waits for the others, re-sent only by its
    fallback timer), so the budget pays for lost frames and lost answers, not for the
    co-workers' losses or lag. At the end of a call (every window on the NIC has sent all
    its uses) the link has room and re-sends need no budget (each slot's back-off still bounds
    them); without that, the last slots trickle out one per RTO. Backing off is per slot
    (``SlotWindow.overdue``), never per NIC: with a window of slots in flight, one NIC-wide
    doubling per lost frame would reach the cap within a few losses."""

    level: int
    switch_ip: str
    rto: Rto = field(default_factory=lambda: Rto(floor=RTO_FLOOR, cap=1.0))
    budget: float = RETX_BUDGET_CAP
    last_forced: float = 0.0
    last_heard: float = 0.0  # when a frame from the switch last arrived
    # When a neighbour's mesh message last arrived over this NIC: its down link is busy with
    # the streams, and the windows' answers wait their turn behind them (``overdue``).
    delivered: float = float("-inf")
    asked: float = 0.0  # when the switch was first asked whether it is alive (0: not asked)
    # A fresh process, or a new plan, whose first windows are not answered yet (``restart``).
    restarted: bool = True
    settling: int = 0  # answers still to come before they are (``expect``)
    questions: int = 0  # how often since

    def restart(self) -> None:
        """The job goes on under a new plan (a re-planning, a shrink): its next call's first
        window is a burst of every member at once, through switches that may now carry
        detoured streams too and still work through the abandoned call's frames, as a fresh
        process's first window is. Until those windows are answered the switch watch waits
        as long as it does for a fresh NIC where that is longer (``watch_bounds``): the first
        answers come through an empty queue, and answer times from them alone say nothing
        of the queue every member's first window then makes (BMv2's default build, bcube:2,2
        on two cores: a second switch taken for dead 1.0-1.3 s into a fresh push, after 25
        quick answers, with its 256 slots queued behind the others')."""
        self.restarted, self.settling = True, 0

    def expect(self, frames: int) -> None:
        """A window put ``frames`` in flight at its start: while restarted, the watch stays
        patient until as many answers came."""
        if self.restarted:
            self.settling += frames

    def heard(self, now: float) -> None:
        """A frame from the switch arrived: it is alive."""
        self.last_heard, self.asked = now, 0.0

    def answered(self) -> None:
        self.settling -= 1
        if self.settling <= 0:
            self.restarted = False
        self.budget = min(RETX_BUDGET_CAP, self.budget + RETX_PER_ANSWER)

    def answer_time(self) -> float:
        """What an answer takes on this NIC now, not capped as the re-send timeout is: the
        liveness bounds grow with it (BMv2's default build answers in seconds under load)."""
        return max(self.rto.value, self.rto.base)

    def refund(self, paid: float) -> None:
        """A recovery the switch answered PENDING: it cost a header-only answer, not a lost
        slot, and the slot is not re-sent again soon, so it is not charged."""
        self.budget = min(RETX_BUDGET_CAP, self.budget + paid)


def scan_interval(nics: list[NicState]) -> float:
    """Until a call's next timer scan (re-sends, the switch watch)."""
    return max(SCAN_LEAST, min(max(TAIL_RTO_FLOOR, nic.rto.base) for nic in nics) / 2)


def watch_bounds(nic: NicState, awaiting: bool, starting: bool = False) -> tuple[float, float]:
    """(silence, deadline) of a liveness watch over this NIC: how long without a sign of life
    before asking, and how long for an answer after. Both grow with the answer times the NIC
    sees, so a loaded link's queue is not taken for a dead part. ``awaiting``: slots of this
    NIC's wait for answers; ``starting``: the call is in its exponent exchange."""
    fresh = (SWITCH_SILENCE, FIRST_ANSWER_DEADLINE if awaiting else
             START_DEADLINE if starting else QUIET_NIC_DEADLINE)
    if not nic.rto.samples:  # no answer time known yet: the call's first burst may be queued
        return fresh
    answer = nic.answer_time()
    silence, deadline = max(SWITCH_SILENCE, answer), max(SWITCH_DEADLINE, 2 * answer)
    if nic.restarted:
        return max(silence, fresh[0]), max(deadline, fresh[1])
    return silence, deadline


def detection_time(nic: NicState) -> float:
    """How long a part of this NIC's takes to be found down once silent (the switch watch's
    two bounds): a failure on the way to this worker has been seen and told by then."""
    return sum(watch_bounds(nic, awaiting=False))


def switch_down(nic: NicState, now: float, ask: Callable[[], None],
                awaiting: bool = True, starting: bool = False) -> bool:
    """The switch watch of one NIC, run on every timer scan of a call. A switch that has sent
    nothing for the watch's silence is asked whether it is alive (``ask`` sends a GENERATION
    question, which it answers whatever the other workers do, four times within the
    deadline); True once it has not answered within the deadline (``watch_bounds``): it is
    down or cut off, and the call fails at once instead of waiting out its timeout. A
    neighbour's mesh message over this NIC came through the switch too: it is as good a sign
    of life as a frame from it (a host-based NIC's only one)."""
    silence, deadline = watch_bounds(nic, awaiting, starting)
    if now - max(nic.last_heard, nic.delivered) < silence:
        nic.asked = 0.0  # alive since any question
        return False
    if not nic.asked:
        nic.asked, nic.questions = now, 0
    elif now - nic.asked > deadline:
        return True
    if now - nic.asked >= nic.questions * deadline / 4:
        nic.questions += 1
        ask()
    return False


def question_wait(nics: list[NicState], levels: Iterable[int], least: float) -> float:
    """How long the switches of ``levels`` get to answer a question: ``least``, or three
    answer times of a NIC that knows them (a loaded switch answers late, not never)."""
    return max([least, *(3 * nics[level].answer_time() for level in levels)])


class SwitchQuestions:
    """Whether some of a worker's switches are alive while no call runs (its mesh being
    made): a GENERATION question to each at once, and again every quarter of ``wait``;
    those that have not answered once ``wait`` has passed are silent. Asked at once, a
    switch down before the processes start is planned around ``wait`` into their mesh.
    Without I/O: the engine sends the questions on its NIC sockets and reads the answers
    (``hosts.engine``), the simulator through its network (``simulation.workers``)."""

    def __init__(self, levels: Iterable[int], now: float, wait: float) -> None:
        self.waiting = set(levels)
        self.started, self.wait = now, wait
        self.rounds = 0

    def due(self, now: float) -> list[int]:
        """The levels to ask now (each round asks every one still silent)."""
        if self.over(now) or now < self.next_due():
            return []
        self.rounds += 1
        return sorted(self.waiting)

    def next_due(self) -> float:
        """When the next round is due (or the wait ends)."""
        return min(self.started + self.rounds * self.wait / 4, self.started + self.wait)

    def answered(self, level: int) -> None:
        self.waiting.discard(level)

    def over(self, now: float) -> bool:
        """Every switch answered, or the wait has passed."""
        return not self.waiting or now >= self.started + self.wait  # as next_due has it

    @property
    def silent(self) -> set[int]:
        """The levels whose switch has not answered (down once ``over``)."""
        return set(self.waiting)


class ResendCounters(Protocol):
    retransmissions: int
    probes: int
    pending: int
    resent: dict[str, int]


class SlotWindow:
    """The slots of one switch job a worker uses, with what is in flight in each and when
    each is presumed lost.

    Slot s carries the window's sequence numbers s, s + W, s + 2W, ... (its uses); every use
    alternates the slot's copy. A subclass says how many uses each slot has
    (``total_uses``) and what a use's frame holds (``frame_of``), and reads the answers. The
    frames presumed in the link's queue are those sent after the latest frame answered (the
    queue is FIFO: anything sent before that one has passed it, or was lost); at most
    ``in_flight`` are, and uses beyond wait in ``held``, lowest sequence number first, so that
    every member sends the blocks in the same order whatever order its answers came in (a
    member sending ahead of the others waits for them in the switch, not the link).

    ``in_order``: every member sends the same sequence in the same order, so a frame of this
    worker's sent later and answered sooner says the earlier one is lost (RACK's evidence
    then waits one timeout, else ``OUT_OF_ORDER_WAIT``). ``one_slot_first``: the members start
    on their own (nothing synchronised them), so until the first answer only the first slot
    is re-sent, and the first answer restarts every slot's timer."""

    def __init__(self, nic: NicState, window: int, total_uses: list[int], in_flight: int,
                 now: float, emit: Callable[[bytes], None], counters: ResendCounters,
                 in_order: bool = True, one_slot_first: bool = False) -> None:
        self.nic = nic
        self.window = window
        self.total_uses = total_uses
        self.in_flight = in_flight
        self.emit = emit
        self.counters = counters
        self.next_use = [0] * window
        self.frames: list[bytes | None] = [None] * window
        self.first_sent = [0.0] * window
        self.last_sent = [0.0] * window
        self.retries = [0] * window
        # Recoveries of the use in flight since the switch last answered it (a PENDING, a
        # MISSING): what a stalled slot's back-off counts. An answer shows the switch and the
        # path alive, so a slot whose re-sent frame or whose sum is lost again after a
        # MISSING waits one timeout, not the back-off of every recovery before it.
        self.unanswered = [0] * window
        self.pending = bytearray(window)  # PENDING answers to the use in flight (up to 255)
        self.probe_next = bytearray(window)  # 1: the slot's next recovery is a PROBE
        self.open_slots = sum(1 for u in total_uses if u)
        # The frames presumed in the queue, by their place in the order this window sent
        # frames (a count, not a time: frames sent in one batch share the time, but not their
        # place in the FIFO), and each slot's last emission's place (a PROBE's: after every
        # frame sent before it).
        self.sends: deque[int] = deque()
        self.sent_frames = 0
        self.place = [0] * window
        self.held: list[tuple[int, int]] = []  # heap of (sequence number, slot)
        self.answered_sent = 0.0  # the latest send time of a frame answered so far
        self.evidence_wait = 1 if in_order else OUT_OF_ORDER_WAIT
        self.one_slot_first = one_slot_first
        self.answers = 0
        self.last_answer = now
        nic.expect(min(in_flight, sum(total_uses)))

    def frame_of(self, slot: int, seq: int) -> bytes:
        """The frame of the slot's next use (sequence number ``seq``)."""
        raise NotImplementedError

    @property
    def done(self) -> bool:
        return self.open_slots == 0

    def launch(self, slot: int, now: float) -> None:
        """The slot's next use is ready: send it once the queue has room."""
        heapq.heappush(self.held, (slot + self.next_use[slot] * self.window, slot))
        self.release(now)

    def release(self, now: float) -> None:
        """Send held uses, lowest sequence number first, while the queue has room."""
        held, sends = self.held, self.sends
        while held and len(sends) < self.in_flight:
            seq, slot = heapq.heappop(held)
            self.send(slot, self.frame_of(slot, seq), now)

    def send(self, slot: int, frame: bytes, now: float) -> None:
        """Send ``frame`` as the slot's use in flight (a first send: its timers start)."""
        self.frames[slot] = frame
        self.first_sent[slot] = self.last_sent[slot] = now
        self.retries[slot] = self.unanswered[slot] = 0
        self.pending[slot] = 0
        self.probe_next[slot] = 1
        self._queued(slot)
        self.emit(frame)

    def _queued(self, slot: int) -> None:
        """The slot's frame goes into the queue, behind every frame sent before it."""
        self.sent_frames += 1
        self.place[slot] = self.sent_frames
        self.sends.append(self.sent_frames)

    def _passed(self, slot: int) -> None:
        """The slot's last frame or PROBE was answered: it left the queue, and so did every
        frame sent before it."""
        sends, place = self.sends, self.place[slot]
        while sends and sends[0] <= place:
            sends.popleft()

    def on_pending(self, now: float, slot: int) -> None:
        """The switch has this worker's contribution to the slot's use in flight (the caller
        checked it is that use), and waits for others: no more re-sends of it until the
        fallback (``overdue``)."""
        self._passed(slot)
        self.unanswered[slot] = 0
        # The fallback runs from the answer. Not an answer that ends a use: it leaves
        # last_answer, so slots of this worker's that wait unanswered while the others are
        # PENDING still count as stalled.
        self.last_sent[slot] = now
        self.release(now)
        if not self.pending[slot]:
            # The first one only (later ones are the fallback's): what the recovery it
            # answers cost, a probe's (the slot's next recovery would be the frame) or a frame's.
            self.nic.refund(1.0 if self.probe_next[slot] else PROBE_COST)
            self.counters.pending += 1
        self.probe_next[slot] = 1  # in: the fallback only asks whether the answer was lost
        self.pending[slot] = min(self.pending[slot] + 1, 255)

    def answered(self, now: float, slot: int) -> None:
        """The slot's use in flight was answered (the caller checked it is that use and took
        what it carries): the slot moves on to its next use, which the caller launches when
        ready (``launch``) unless the slot is finished (``finished(slot)``)."""
        if self.retries[slot] == 0:  # unambiguous: the answer is to the one send (Karn)
            self.nic.rto.sample(now - self.first_sent[slot])
            self.answered_sent = max(self.answered_sent, self.first_sent[slot])
        self._passed(slot)
        if self.one_slot_first and not self.answers:
            # The first answer: every member is up now. Timers that ran while they were
            # starting restart, instead of all firing at once.
            self.last_sent = [now] * self.window
        self.answers += 1
        self.last_answer = self.nic.delivered = now
        self.frames[slot] = None
        self.next_use[slot] += 1
        self.nic.answered()
        if self.next_use[slot] >= self.total_uses[slot]:
            self.open_slots -= 1

    def finished(self, slot: int) -> bool:
        return self.next_use[slot] >= self.total_uses[slot]

    def overdue(self, now: float, draining: bool) -> list[tuple[float, SlotWindow, int, str]]:
        """(last sent, self, slot, why) of every slot whose answer is overdue, presumed lost:
        one timeout after the last send if a frame sent after it has been answered since
        (RACK's rule). Otherwise, while answers keep coming, its answer is only waiting its
        turn (in a queue, or for a co-worker) and it is not re-sent; once nothing has been
        answered for a timeout (a tail of lost frames, a co-worker's lost frame, a stop; while
        the window still has uses to send and many frames in the queue, ``MID_CALL_STALL``
        timeouts), one timeout doubling per recovery since the switch last answered the slot
        (per-slot back-off), from the second. A slot answered
        PENDING ``PENDING_FALLBACK`` timeouts after that answer, doubling (up to 8 times) from
        its ``PENDING_PATIENCE``-th. ``draining``: ``self.draining()``, which the caller has."""
        rto = self.nic.rto
        cap, estimate = rto.cap, rto.base
        if draining and rto.samples:
            # The window's end: nothing new joins the queues, so an answer takes what the
            # quickest ones took, not the loaded median the timeout follows mid-call.
            estimate = min(estimate, RTO_QUANTILES * min(rto.samples))
        # Few of the window's frames presumed in the link's queue: nothing of its own for an
        # answer to wait behind (a call's tail, or a slot left behind by its recoveries
        # while the others have finished).
        few = len(self.sends) <= self.in_flight * TAIL_FRAMES
        base = min(cap, max(TAIL_RTO_FLOOR if few else rto.floor, estimate))
        pending, unanswered, last_sent = self.pending, self.unanswered, self.last_sent
        answered_sent = self.answered_sent
        silence = base if draining or few else base * MID_CALL_STALL
        stalled = now - max(self.last_answer, self.nic.delivered) > silence
        overdue = []
        frames = self.frames
        if self.one_slot_first and not self.answers:
            frames = frames[:1]  # the others may not have started: try one slot
        for slot, frame in enumerate(frames):
            if frame is None:
                continue
            sent = last_sent[slot]
            if pending[slot]:
                late = min(max(pending[slot] - PENDING_PATIENCE, 0), 3)
                wait = min(cap, base) * PENDING_FALLBACK * (1 << late)
                why = "pending"
            elif sent < answered_sent:
                # Lost, all but surely (a frame sent after it has come back): no back-off, as
                # the evidence is fresh each time; backing off would leave a call's last,
                # unlucky slots waiting seconds under heavy loss.
                wait = min(cap, base) * self.evidence_wait
                why = "ordered"
            elif stalled:
                # Doubling twice at most: nothing is answered (a call's tail, a co-worker's
                # lost frame, a dead switch, which the switch watch finds).
                wait = min(cap, base * (1 << min(max(unanswered[slot] - 1, 0), 2)))
                why = "stalled"
            else:
                continue
            if now - sent > wait:
                overdue.append((sent, self, slot, why))
        return overdue

    def on_missing(self, now: float, slot: int) -> None:
        """The switch does not hold this worker's contribution to the slot's use in flight
        (the caller checked it is that use): it was lost, so it goes again now."""
        self._passed(slot)
        self.probe_next[slot] = 0
        self.unanswered[slot] = 0
        self.resend(slot, now, "missing")

    def resend(self, slot: int, now: float, why: str) -> None:
        """Recover the slot's use in flight: a PROBE or the frame itself, in turn."""
        self.last_sent[slot] = now
        self.retries[slot] += 1
        self.unanswered[slot] += 1
        frame = self.frames[slot]
        if self.probe_next[slot]:
            self.probe_next[slot] = 0
            self.counters.probes += 1
            self.place[slot] = self.sent_frames
            self.emit(probe_of(frame))
            return
        self.probe_next[slot] = 1
        self._queued(slot)
        self.counters.retransmissions += 1
        self.counters.resent[why] += 1
        self.emit(frame)

    def waiting(self) -> int:
        return sum(1 for frame in self.frames if frame is not None)

    def draining(self) -> bool:
        """Every use of every slot is sent (and the last ones wait for answers) or answered:
        the window's end, nothing new will go out."""
        frames, total = self.frames, self.total_uses
        return all(use >= total[slot] or (use + 1 == total[slot] and frames[slot] is not None)
                   for slot, use in enumerate(self.next_use))


def resend_overdue(nic: NicState, windows: list[SlotWindow], now: float) -> None:
    """Re-send the overdue slots of a NIC's windows, longest-waiting first, within its
    budget."""
    draining = [window.draining() for window in windows]
    overdue = sorted((entry for window, end in zip(windows, draining, strict=True)
                      for entry in window.overdue(now, end)), key=lambda entry: entry[0])
    if not overdue:
        return
    # The end of the call on this NIC (its windows have sent everything): the link has room,
    # and each slot's own back-off bounds its re-sends, so no budget is needed. (Not
    # mid-call: there late slots often wait for lagging co-workers.)
    ending = all(draining)
    rto = nic.rto.value
    for _sent, window, slot, why in overdue:
        if not ending:
            cost = PROBE_COST if window.probe_next[slot] else 1.0
            if nic.budget >= cost:
                nic.budget -= cost
            elif now - nic.last_forced > rto:
                nic.last_forced = now
            else:
                break
        window.resend(slot, now, why)
