"""The BCube executor: one worker drives all k of its NICs at once through a schedule.

A call (``Engine.allreduce``) runs in three phases, all in one event loop over one UDP socket
per NIC (to the switches) and the TCP mesh to the BCube neighbours (``hosts/mesh.py``):

1. **Exponents.** Every block's max exponent over all N servers, by a max-exchange with the
   neighbours of each dimension in turn (k rounds); it also checks that every worker has the
   same gradient length and runs the same schedule, agrees the call's generation (newer than
   anything an aborted call left in the switches, docs/PROTOCOL.md), and it is the call's
   barrier. Every worker
   then quantises with that global exponent for N contributions, so every partial sum, at any
   level, is an exact int32 that cannot overflow (``hosts/quantize.py``): relays forward
   integers and the error bound is the single switch's for N workers.
2. **Steps, pipelined per block** (``bml/schedule.py``): a block enters a stripe's next step the
   moment its previous one delivers it. Steps in the switch run as a ``SwitchChannel``: a
   window of slots of the stripe's switch job, one per (stripe, level), with per-slot timers
   and retransmission (the switch answers a re-sent contribution with the stored sum); it
   uses more slots than it keeps frames in flight, so slots waiting on a loss do not idle
   the link.
   Host-based steps send messages over TCP. All-gather in the switch is a BROADCAST that the
   switch copies to the other n-1 servers; a copy that was lost is asked for again (NEED)
   over TCP once its sender said it has broadcast everything (SENT).
3. **Done.** A worker with the whole result says DONE to every neighbour and ends when every
   neighbour said DONE to it (so nobody still needs a repair from it) and every switch slot
   it used is back on copy 0 (an even number of uses: the next call starts clean).

Every wait is bounded (``start_timeout`` for the mesh and the exponent round, ``timeout`` for
the call), and a neighbour's closed connection ends the call at once with its name. A switch
or link that fails mid-call is re-planned around (its group's level in the hosts, over
detours), and an elastic job on a star goes on without a worker that left: in both cases every
worker learns it from the ABORT that names it and runs the call again (docs/PROTOCOL.md,
"Re-planning", "Elastic jobs").
"""

from __future__ import annotations

import bisect
import heapq
import json
import select
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bml.protocol import (
    BML_UDP_PORT,
    EXPONENT_NONE,
    GENERATIONS,
    HEADER_BYTES,
    HEADER_STRUCT,
    PAYLOAD_BYTES,
    VALUES_PER_PACKET,
    PacketType,
    job_udp_port,
    newer_generation,
)
from bml.schedule import (
    DEFAULT_WINDOW,
    HOST_BASED,
    MESSAGE_BLOCKS,
    STRIPE_JOB_STRIDE,
    Group,
    Layout,
    Op,
    Range,
    Schedule,
    ScheduleError,
    channel_slots,
    channel_window,
    length,
    make_schedule,
    mesh_is_control_only,
    nic_in_flight,
    split,
    stream_budgets,
    stripe_job_id,
)
from bml.topology import Topology
from hosts.mesh import Kind, Mesh, MeshError, Peer, abort_reason, queue_full
from hosts.quantize import block_exponents, dequantize, shift
from hosts.sockets import force_buffers
from hosts.transport import (
    PRIMING_OFFSET,
    LengthMismatch,
    Rto,
    TransportError,
    generation_question,
)

_BE = np.dtype(">i4")

_ZEROS = bytes(4 * VALUES_PER_PACKET)
_RESULTS = (PacketType.RESULT, PacketType.RESULT_RETX, PacketType.ACK)


class PartFailed(TransportError):
    """A switch, or this server's link to it, stopped: the call can be re-planned around the
    ``broken`` groups (``Schedule.degraded``)."""

    def __init__(self, message: str, broken: set[Group]) -> None:
        super().__init__(message)
        self.broken = set(broken)


class WorkerLost(TransportError):
    """A neighbour left mid-call (its connection closed): an elastic job goes on without the
    ``lost`` servers; any other fails the call naming them."""

    def __init__(self, message: str, lost: set[int]) -> None:
        super().__init__(message)
        self.lost = set(lost)


@dataclass
class Replan:
    """One re-planning inside a call: what failed, and how long the call took to go on."""

    cause: str
    schedule: list[str]  # the degraded schedule's description
    gave_up_at: float  # time.monotonic() when this worker gave up on the failed plan
    resumed_at: float = 0.0  # ... and when the new plan gave it its first whole block

    @property
    def recovery_seconds(self) -> float:
        return self.resumed_at - self.gave_up_at


@dataclass
class EngineStats:
    seconds: float = 0.0
    frames_sent: int = 0
    retransmissions: int = 0
    pending: int = 0  # re-sent slots the switch answered PENDING (contribution already in)
    # Re-sends by why the slot was overdue: a frame sent after it was answered (RACK), no
    # answer at all for a timeout (stalled), a PENDING slot's fallback.
    resent: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("ordered", "stalled", "pending"), 0))
    broadcasts: int = 0
    repairs_asked: int = 0
    stream_bytes: int = 0
    exponent_seconds: float = 0.0
    first_result: float = 0.0  # monotonic time of the first whole block
    last_result: float = 0.0  # ... and of the last: the rest of the call is the ending
    replans: list[Replan] = field(default_factory=list)
    attempt_seconds: float = 0.0  # the last attempt alone (after a re-planning: the new plan)


RETX_PER_ANSWER = 0.5  # re-send budget a NIC earns per answered slot
RETX_BUDGET_CAP = 64.0
# A slot the switch answered PENDING (this worker's contribution is in, the copy waits for
# others) is not re-sent again before this many timeouts (doubling with every further
# PENDING): only if the final answer is lost on its way does the switch need to hear from
# this worker again.
PENDING_FALLBACK = 2
OUT_OF_ORDER_WAIT = 3  # timeouts RACK's evidence waits where members send in their own orders
# Timeouts without any answer before a channel that still has uses to send presumes its
# frames in flight lost. Mid-call a loss shows as a later frame answered first (RACK's rule);
# a channel all of whose answers pause is mostly waiting behind its NIC's down link, busy with
# the neighbours' broadcasts and streams (bcube:3,2 mixed at 2 Mbit/s: 400-1,300 needless
# re-sends per call at one timeout, none at four, 1.16x -> 1.10-1.12x of its prediction). At
# a channel's end no later frame can give that evidence, and one timeout is the rule.
MID_CALL_STALL = 4
SWITCH_SILENCE = 2.0  # s without a frame from a switch that owes answers: ask if it is alive
SWITCH_DEADLINE = 1.5  # s more without an answer to that question: the switch is down


@dataclass
class NicLink:
    """One NIC: its UDP socket to its switch, the frames the kernel could not take yet, and
    its re-send budget.

    A slot's answer waits for every member of its group, so a late answer often means a slow
    neighbour or a full queue, not a loss; re-sending then only lengthens the queues, and on a
    loaded machine every re-send makes the next one likelier. So re-sends are clocked by
    answers (like TCP's ACK clock): each answered slot earns ``RETX_PER_ANSWER`` re-sends, and
    with the budget spent only the longest-waiting slot is re-sent, once per RTO. The switch
    tells a re-send into a copy that already holds this worker's contribution (``PENDING``):
    that re-send is refunded (the slot then waits for the others, re-sent only by its
    fallback timer), so the budget pays for lost frames and lost answers, not for the
    co-workers' losses or lag. At the end of a call (every channel on the NIC has sent all
    its uses) the link has room and re-sends need no budget (each slot's back-off still bounds
    them); without that, the last slots trickle out one per RTO."""

    level: int
    ip: str
    switch_ip: str
    sock: socket.socket
    outbox: deque = field(default_factory=deque)
    budget: float = RETX_BUDGET_CAP
    last_forced: float = 0.0
    last_heard: float = 0.0  # when a frame from the switch last arrived
    asked: float = 0.0  # when the switch was first asked whether it is alive (0: not asked)
    questions: int = 0  # how often since

    def answered(self) -> None:
        self.budget = min(RETX_BUDGET_CAP, self.budget + RETX_PER_ANSWER)

    def refund(self) -> None:
        """A re-send the switch answered PENDING: it cost a header-only answer, not a lost
        slot, and the slot is not re-sent again soon, so it is not charged."""
        self.budget = min(RETX_BUDGET_CAP, self.budget + 1)

    def send(self, frame: bytes) -> None:
        if not self.outbox:
            try:
                self.sock.sendto(frame, (self.switch_ip, BML_UDP_PORT))
                return
            except OSError as exc:
                if not queue_full(exc):
                    raise TransportError(f"sending on level {self.level}: {exc}") from None
        self.outbox.append(frame)

    def drain(self) -> None:
        while self.outbox:
            try:
                self.sock.sendto(self.outbox[0], (self.switch_ip, BML_UDP_PORT))
            except OSError as exc:
                if queue_full(exc):
                    return
                raise TransportError(f"sending on level {self.level}: {exc}") from None
            self.outbox.popleft()


class SwitchChannel:
    """One stripe's step in one switch: a window of the stripe's switch-job slots.

    Every member sends the same blocks in the same order (block i of ``blocks`` always uses
    slot i mod W, use i // W), each as soon as it is ready and its slot free, so the members'
    contributions meet in the same slot copy. ``owners`` says whose each block's sum is
    (reduce-scatter: the switch sends it to the owner, an ACK to the others); None means all
    get it (allreduce). ``in_order``: every member has every block ready from the start (a
    stripe's first step), so all send in the same order; only then does the channel use more
    of its ``window`` slots than its ``in_flight`` frames (``bml.schedule.channel_slots``)."""

    def __init__(self, call: _Call, nic: NicLink, stripe: int, blocks: list[int],
                 owners: list[int] | None, window: int, in_flight: int,
                 in_order: bool = True) -> None:
        self.call, self.nic, self.stripe = call, nic, stripe
        self.job = stripe_job_id(call.engine.job, stripe)
        self.me = call.topology.digits(call.engine.server)[nic.level]
        self.blocks = blocks
        self.owners = owners
        self.count = len(blocks)
        self.window = channel_window(self.count, channel_slots(window, in_flight, in_order))
        self.seq_of = {b: i for i, b in enumerate(blocks)}
        self.ready_flags = bytearray(self.count)
        self.next_use = [0] * self.window
        uses = [-(-(self.count - s) // self.window) for s in range(self.window)]
        self.total_uses = [u + (u & 1) for u in uses] if self.count else [0] * self.window
        self.frames: list[bytes | None] = [None] * self.window
        self.first_sent = [0.0] * self.window
        self.last_sent = [0.0] * self.window
        self.retries = [0] * self.window
        self.pending = bytearray(self.window)  # PENDING answers to the use in flight
        self.open_slots = sum(1 for u in self.total_uses if u)
        self.name = f"stripe {stripe} on level {nic.level}"
        # Frames presumed in the link's queue: sent after the latest frame answered (the
        # queue is FIFO: anything sent before that one has passed it, or was lost; for a
        # re-sent slot, which of its sends was answered is not known: the last). At most
        # ``in_flight``; uses beyond wait in ``held``, lowest sequence number first, so that
        # every member sends the blocks in the same order whatever order its answers came in
        # (a member sending ahead of the others waits for them in the switch, not the link).
        self.in_flight = in_flight
        self.sends: deque[float] = deque()  # send times of the frames in the queue
        self.held: list[tuple[int, int]] = []  # heap of (sequence number, slot)
        self.answered_sent = 0.0  # the latest send time of a frame answered so far
        # Whether every member sends in the same order, so that a frame of this worker's
        # sent later and answered sooner says the earlier one is lost: true where every block
        # is ready at the start (a stripe's first step); a later step's blocks become ready
        # in a different order on each member (as the step before delivers them), and an
        # answer then only says that everyone had that block ready.
        self.evidence_wait = 1 if in_order else OUT_OF_ORDER_WAIT
        self.last_answer = time.monotonic()

    @property
    def done(self) -> bool:
        return self.open_slots == 0

    def ready(self, block: int) -> None:
        seq = self.seq_of[block]
        self.ready_flags[seq] = 1
        slot = seq % self.window
        if self.frames[slot] is None and self.next_use[slot] * self.window + slot == seq:
            self._launch(slot, time.monotonic())

    def _launch(self, slot: int, now: float) -> None:
        heapq.heappush(self.held, (slot + self.next_use[slot] * self.window, slot))
        self.release(now)

    def release(self, now: float) -> None:
        """Send held uses, lowest sequence number first, while the queue has room."""
        held, sends = self.held, self.sends
        while held and len(sends) < self.in_flight:
            self._send_use(heapq.heappop(held)[1], now)

    def _passed(self, sent: float) -> None:
        """A frame sent at ``sent`` was answered: frames sent up to then left the queue."""
        sends = self.sends
        while sends and sends[0] <= sent:
            sends.popleft()

    def _send_use(self, slot: int, now: float) -> None:
        use = self.next_use[slot]
        seq = slot + use * self.window
        call = self.call
        if seq < self.count:
            block = self.blocks[seq]
            owner = self.owners[seq] if self.owners is not None else 0
            frame = HEADER_STRUCT.pack(
                PacketType.DATA, use & 1, self.job, self.me, owner, slot,
                int(call.exponents[block]), call.valid_count(block), call.generation,
                block * VALUES_PER_PACKET) + call.acc[block].astype(_BE).tobytes()
        else:  # flush: every slot ends on an even number of uses
            frame = HEADER_STRUCT.pack(PacketType.DATA, use & 1, self.job, self.me, 0, slot,
                                       EXPONENT_NONE, 0, call.generation,
                                       PRIMING_OFFSET) + _ZEROS
        self.frames[slot] = frame
        self.first_sent[slot] = self.last_sent[slot] = now
        self.retries[slot] = 0
        self.pending[slot] = 0
        self.sends.append(now)
        self.nic.send(frame)
        call.stats.frames_sent += 1

    def _expects(self, version: int, slot: int, offset: int, generation: int) -> int | None:
        """The sequence number of the use an answer with these fields is for, if it is the
        slot's use in flight; None for a late, stray or foreign answer."""
        if slot >= self.window or self.frames[slot] is None or generation != self.call.generation:
            return None
        use = self.next_use[slot]
        if version != use & 1:
            return None
        seq = slot + use * self.window
        expected = self.blocks[seq] * VALUES_PER_PACKET if seq < self.count else PRIMING_OFFSET
        return seq if offset == expected else None

    def on_pending(self, version: int, slot: int, offset: int, generation: int) -> None:
        """The switch has this worker's contribution to the slot's use in flight, and waits
        for others: no more re-sends of it until the fallback (``overdue``)."""
        if self._expects(version, slot, offset, generation) is None:
            return
        now = time.monotonic()
        self._passed(self.last_sent[slot])
        self.last_sent[slot] = self.last_answer = now  # the fallback runs from the answer
        self.release(now)
        if not self.pending[slot]:
            self.nic.refund()  # the first one only: later ones are the fallback's
            self.call.stats.pending += 1
        self.pending[slot] = min(self.pending[slot] + 1, 3)  # the fallback doubles twice

    def on_result(self, ptype: int, version: int, slot: int, offset: int, generation: int,
                  buffer: bytearray, size: int) -> None:
        seq = self._expects(version, slot, offset, generation)
        if seq is None:
            return
        use = self.next_use[slot]
        block = self.blocks[seq] if seq < self.count else -1
        mine = self.owners is None or (block >= 0 and self.owners[seq] == self.me)
        if block >= 0 and mine and (ptype == PacketType.ACK or size < PAYLOAD_BYTES):
            return  # the owner needs the values
        now = time.monotonic()
        if self.retries[slot] == 0:  # unambiguous: the answer is to the one send (Karn)
            self.call.rto[self.nic.level].sample(now - self.first_sent[slot])
            self.answered_sent = max(self.answered_sent, self.first_sent[slot])
        self._passed(self.last_sent[slot])
        self.last_answer = now
        self.frames[slot] = None
        self.next_use[slot] = use + 1
        self.nic.answered()
        if block >= 0 and mine:
            values = np.frombuffer(buffer, dtype=_BE, count=VALUES_PER_PACKET,
                                   offset=HEADER_BYTES)
            self.call.reduced(self.stripe, self.nic.level, block, values)
        if self.next_use[slot] >= self.total_uses[slot]:
            self.open_slots -= 1
        else:
            following = slot + self.next_use[slot] * self.window
            if following >= self.count or self.ready_flags[following]:
                self._launch(slot, now)
        self.release(now)

    def overdue(self, now: float, rto: Rto,
                draining: bool) -> list[tuple[float, SwitchChannel, int, str]]:
        """(last sent, self, slot, why) of every slot whose answer is overdue, presumed lost:
        one timeout after the last send if a frame sent after it has been answered since
        (RACK's rule). Otherwise, while answers keep coming, its answer is only waiting its
        turn (in a queue, or for a co-worker) and it is not re-sent; once nothing has been
        answered for a timeout (a tail of lost frames, a co-worker's lost frame, a stop; while
        the channel still has uses to send, ``MID_CALL_STALL`` timeouts), one timeout
        doubling per retry from the second (per-slot back-off). A slot answered
        PENDING ``PENDING_FALLBACK`` timeouts after that answer, doubling with further
        PENDINGs (twice at most). ``draining``: ``self.draining()``, which the caller has."""
        base, cap = rto.value, rto.cap
        pending, retries, last_sent = self.pending, self.retries, self.last_sent
        answered_sent = self.answered_sent
        silence = base if draining else base * MID_CALL_STALL
        stalled = now - self.last_answer > silence
        overdue = []
        for slot, frame in enumerate(self.frames):
            if frame is None:
                continue
            sent = last_sent[slot]
            if pending[slot]:
                # Doubling twice at most: a slot whose answer is lost must not wait long.
                wait = min(cap, base) * PENDING_FALLBACK * (1 << (pending[slot] - 1))
                why = "pending"
            elif sent < answered_sent:
                # Lost, all but surely (a frame sent after it has come back): no back-off,
                # which at 10% loss left the unlucky slots of a call's end waiting seconds.
                wait = min(cap, base) * self.evidence_wait
                why = "ordered"
            elif stalled:
                # Doubling twice at most: nothing is answered (a call's tail, a co-worker's
                # lost frame, a dead switch, which _watch_switches finds): at 10% loss an
                # unlucky last slot backed off to seconds.
                wait = min(cap, base * (1 << min(max(retries[slot] - 1, 0), 2)))
                why = "stalled"
            else:
                continue
            if now - sent > wait:
                overdue.append((sent, self, slot, why))
        return overdue

    def resend(self, slot: int, now: float, why: str) -> None:
        self.sends.append(now)
        self.nic.send(self.frames[slot])
        self.last_sent[slot] = now
        self.retries[slot] += 1
        stats = self.call.stats
        stats.retransmissions += 1
        stats.frames_sent += 1
        stats.resent[why] += 1

    def waiting(self) -> int:
        return sum(1 for frame in self.frames if frame is not None)

    def draining(self) -> bool:
        """Every use of every slot is sent (and the last ones wait for answers) or answered:
        the channel's end, nothing new will go out."""
        frames, total = self.frames, self.total_uses
        return all(use >= total[slot] or (use + 1 == total[slot] and frames[slot] is not None)
                   for slot, use in enumerate(self.next_use))


class Engine:
    """A worker of one job on every NIC of its server; keep it for many calls."""

    def __init__(self, job: int, server: int, topology: Topology, schedule: Schedule,
                 nics: list[tuple[str, str]], window: int = DEFAULT_WINDOW,
                 timeout: float = 60.0,
                 start_timeout: float = 10.0, elastic: bool = False) -> None:
        """``nics``: (own address, switch address) per level. ``elastic``: on a star, when a
        worker leaves mid-call the others go on without it (``_shrink``)."""
        self.job, self.server, self.topology, self.schedule = job, server, topology, schedule
        self.elastic = elastic
        # The job's servers; after a shrink, ``topology`` is a star of the survivors, and
        # ``server`` this worker's position in ``members``.
        self.whole = topology
        self.members = list(range(topology.num_servers))
        self.window, self.timeout, self.start_timeout = window, timeout, start_timeout
        self.calls = 0
        # The last call's generation if it ended well; None: ask the switches (a fresh worker,
        # or one whose last call failed and may have left state behind).
        self.generation: int | None = None
        # Per NIC, learnt across calls. Backing off is per slot (SwitchChannel.overdue), never
        # per NIC: with a window of slots in flight, one NIC-wide doubling per lost frame would
        # reach the cap within a few losses and stall every slot, and every repair, for seconds.
        self.rto = [Rto(floor=0.02, cap=1.0) for _ in range(topology.k)]
        self.links: list[NicLink] = []
        try:
            for level, (ip, switch_ip) in enumerate(nics):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                force_buffers(sock)
                try:
                    sock.bind((ip, job_udp_port(job)))
                except OSError as exc:
                    sock.close()
                    raise TransportError(f"cannot bind {ip}:{job_udp_port(job)} for job "
                                         f"{job}: {exc}") from None
                sock.setblocking(False)
                self.links.append(NicLink(level, ip, switch_ip, sock))
            self.mesh = self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> Mesh:
        """The mesh to the neighbours, over detours on the levels the schedule has broken."""
        detours = {level: self.topology.detour_level(level) for level in range(self.topology.k)
                   if self.schedule.is_broken(self.server, level)}
        addresses = [tuple(nic.ip for nic in self.whole.nics(m)) for m in self.members]
        try:
            return Mesh(self.job, self.server, self.topology, self.start_timeout, detours,
                        addresses, stream_budgets(self.schedule, self.server),
                        mesh_is_control_only(self.schedule, self.server))
        except MeshError as exc:
            raise TransportError(str(exc)) from None

    @property
    def home(self) -> int:
        """This worker's server number in the job's topology."""
        return self.members[self.server]

    def home_of(self, peer: Peer) -> int:
        return self.members[peer.server]

    @property
    def plan_code(self) -> str:
        """What every worker of a call must agree on: the schedule and who takes part."""
        if len(self.members) == self.whole.num_servers:
            return self.schedule.code
        return f"{self.schedule.code}:servers={','.join(map(str, self.members))}"

    def close(self) -> None:
        for link in self.links:
            link.sock.close()
        self.links = []
        mesh = getattr(self, "mesh", None)
        if mesh is not None:
            mesh.close()

    def allreduce(self, values: np.ndarray,
                  progress: Callable[[int, int], None] | None = None
                  ) -> tuple[np.ndarray, EngineStats]:
        """Sum of ``values`` (flat float32) over the job's N servers, and the call's stats.

        A switch or link that fails mid-call is re-planned around (every worker learns of it
        from the ABORT that names it) and the call runs again on the degraded schedule, which
        the engine keeps for its later calls."""
        flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
        started = time.monotonic()
        replans: list[Replan] = []
        while True:
            self.calls += 1
            call = _Call(self, flat, progress)
            generation, self.generation = self.generation, None
            try:
                result, stats = call.run(generation)
            except PartFailed as exc:
                self.mesh.abort(call.tag, str(exc), exc.broken)
                gave_up_at = time.monotonic()
                if replans:
                    replans[-1].resumed_at = call.stats.first_result or gave_up_at
                self._replan(exc)
                replans.append(Replan(str(exc), self.schedule.describe(), gave_up_at))
                continue
            except WorkerLost as exc:
                self.mesh.abort(call.tag, str(exc), lost=exc.lost)
                if not self.elastic:
                    raise TransportError(str(exc)) from None
                gave_up_at = time.monotonic()
                self._shrink(exc)
                survivors = (f"servers {', '.join(map(str, self.members))} go on without "
                             f"{', '.join(map(str, sorted(exc.lost)))} (elastic)")
                replans.append(Replan(str(exc), [*self.schedule.describe(), survivors],
                                      gave_up_at))
                continue
            except (MeshError, TransportError) as exc:
                self.mesh.abort(call.tag, str(exc))  # relayed, so every worker names the cause
                raise TransportError(str(exc)) from None
            self.generation = call.generation
            if replans:
                replans[-1].resumed_at = stats.first_result
            stats.replans = replans
            stats.attempt_seconds = stats.seconds
            stats.seconds = time.monotonic() - started  # failed attempts included
            return result, stats

    def _shrink(self, loss: WorkerLost) -> None:
        """Go on with the survivors: a star of them, host-based (the switch's job still
        counts the whole membership, and only the control plane could change that), over
        the same NICs."""
        if self.whole.k != 1:
            raise TransportError(f"{loss}; an elastic job shrinks on a star only "
                                 f"({self.whole.spec} is a BCube)")
        members = [m for m in self.members if m not in loss.lost]
        if len(members) == len(self.members):  # nobody new left: no way on
            raise TransportError(f"{loss}; it was already left out")
        if len(members) < 2 or self.home not in members:
            raise TransportError(f"{loss}; fewer than two workers are left")
        home = self.home
        self.mesh.close(linger=1.0)
        self.members = members
        self.topology = Topology(len(members), 1, "star")
        self.server = members.index(home)
        self.schedule = make_schedule(self.topology, HOST_BASED)
        self.mesh = self._connect()

    def _replan(self, failure: PartFailed) -> None:
        """Go on without the failed groups: a degraded schedule and a mesh over detours."""
        if failure.broken <= self.schedule.broken:  # already planned around: no way on
            raise TransportError(f"{failure}; it was already re-planned around") from None
        try:
            schedule = self.schedule.degraded(failure.broken)
        except ScheduleError as exc:
            raise TransportError(f"{failure}; no re-planning around it: {exc}") from None
        self.mesh.close(linger=1.0)
        self.schedule = schedule
        self.mesh = self._connect()

    def switch_jobs(self) -> list[tuple[int, int]]:
        """(level, stripe) of every switch job the schedule aggregates in."""
        return sorted({(s.dim, p) for p in range(len(self.schedule.stripes))
                       for s in self.schedule.steps_of(p, self.server)
                       if s.op is not Op.AG and s.switch_share > 0})

    def ask_generation(self) -> int:
        """The newest generation any of this worker's switch jobs is at (0 if it uses none):
        a GENERATION question to each, asked again until answered within ``start_timeout``."""
        me = self.topology.digits(self.server)
        waiting = {(level, stripe_job_id(self.job, p)) for level, p in self.switch_jobs()}
        newest = 0
        deadline = time.monotonic() + self.start_timeout
        buffer = bytearray(PAYLOAD_BYTES + 64)
        next_ask = 0.0
        while waiting:
            now = time.monotonic()
            if now > deadline:
                level, job = min(waiting)
                raise TransportError(
                    f"job {self.job} server {self.home}: switch {self.links[level].switch_ip}"
                    f" (level {level}) did not answer for switch job {job} within "
                    f"{self.start_timeout:g} s: is the switch up, and is job {self.job} set up "
                    "on it (bml-ctl job-add --servers all)?")
            if now >= next_ask:
                for level, job in waiting:
                    self.links[level].send(generation_question(job, me[level]))
                next_ask = now + 0.2
            select.select([link.sock for link in self.links], [], [], 0.05)
            for link in self.links:
                link.drain()
                while True:
                    try:
                        size = link.sock.recv_into(buffer)
                    except (BlockingIOError, InterruptedError):
                        break
                    if size < HEADER_BYTES:
                        continue
                    ptype, _v, job, *_rest, generation, _o = HEADER_STRUCT.unpack_from(buffer)
                    if ptype == PacketType.GENERATION and (link.level, job) in waiting:
                        waiting.discard((link.level, job))
                        if newer_generation(generation, newest):
                            newest = generation
        return newest


class _Call:
    """The state of one allreduce: blocks, their stage in each stripe, channels, messages."""

    def __init__(self, engine: Engine, flat: np.ndarray,
                 progress: Callable[[int, int], None] | None) -> None:
        self.engine = engine
        self.topology = engine.topology
        self.schedule = engine.schedule
        self.flat = flat
        self.progress = progress
        self.tag = engine.calls & 0xFF  # in every message of this call on the mesh
        self.generation = 0  # in every frame of this call to a switch (agreed by the exchange)
        self.length = flat.size
        self.blocks = max(1, -(-flat.size // VALUES_PER_PACKET))
        self.stats = EngineStats()
        self.rto = engine.rto  # per NIC, kept across calls
        self.layout = Layout(self.schedule, self.blocks)
        me = self.topology.digits(engine.server)
        self.me = me
        self.pieces = [self.layout.pieces(p, engine.server) for p in range(self.topology.k)]
        steps = [self.schedule.steps_of(p, engine.server) for p in range(self.topology.k)]
        self.rs_dims = [self.schedule.rs_dims(p, engine.server) for p in range(self.topology.k)]
        self.ar_dim = [next((s.dim for s in stripe if s.op is Op.AR), None) for stripe in steps]
        self.ag_in_switch = [{s.dim: bool(s.switch_share) for s in stripe if s.op is Op.AG}
                             for stripe in steps]
        self.stripe_starts = [self.layout.stripe(p)[0] for p in range(self.topology.k)]

    # --- helpers ------------------------------------------------------------------------
    def stripe_of(self, block: int) -> int:
        return bisect.bisect_right(self.stripe_starts, block) - 1

    def valid_count(self, block: int) -> int:
        return max(0, min(VALUES_PER_PACKET, self.length - block * VALUES_PER_PACKET))

    def depth(self, stripe: int, block: int) -> int:
        """The deepest piece of this server that holds ``block``."""
        depth = 0
        for j, (start, stop) in enumerate(self.pieces[stripe]):
            if start <= block < stop:
                depth = j
        return depth

    # --- the call -----------------------------------------------------------------------
    def run(self, last_generation: int | None) -> tuple[np.ndarray, EngineStats]:
        """The call; ``last_generation``: this worker's last call's, if it ended well."""
        started = time.monotonic()
        if last_generation is None:
            last_generation = self.engine.ask_generation()
        padded = np.zeros((self.blocks, VALUES_PER_PACKET), dtype=np.float32)
        padded.reshape(-1)[:self.length] = self.flat
        self.exponents = self._exchange_exponents(block_exponents(padded),
                                                  (last_generation + 1) % GENERATIONS)
        self.stats.exponent_seconds = time.monotonic() - started
        n_total = self.topology.num_servers
        scale = shift(self.exponents, n_total)
        self.acc = np.rint(np.ldexp(padded.astype(np.float64), scale[:, None])).astype(np.int32)
        self._prepare()
        self._loop(started)
        self.stats.seconds = time.monotonic() - started
        self.stats.stream_bytes = sum(p.sent_bytes for p in self.engine.mesh.all())
        result = dequantize(self.acc, self.exponents, n_total).reshape(-1)[:self.length]
        return result, self.stats

    def _exchange_exponents(self, own: np.ndarray, generation: int) -> np.ndarray:
        """Max over all N servers, one dimension at a time; also the lengths and schedules
        every worker has, so that any difference is refused by every worker alike, and the
        newest of the generations they propose: the call's (``self.generation``)."""
        exponents = own.astype(np.uint8)
        lengths = [self.length, self.length]
        codes = {self.engine.plan_code}
        deadline = time.monotonic() + self.engine.timeout
        for peer in self.engine.mesh.all():
            peer.done = False
        for dim in range(self.topology.k):
            peers = self.engine.mesh.neighbours(dim)
            head = json.dumps({"lengths": lengths, "codes": sorted(codes),
                               "generation": generation}).encode()
            for peer in peers:
                peer.send(Kind.EXPONENTS, self.tag, 0, dim, len(head), exponents.size,
                          head + exponents.tobytes())
            got: dict[int, tuple[dict, np.ndarray]] = {}
            while len(got) < len(peers):
                self._wait(peers, deadline, f"the exponent exchange on level {dim}",
                           [self.engine.home_of(p) for p in peers if p.server not in got])
                for peer in peers:
                    if peer.server in got:
                        continue
                    for kind, _s, step, start, count, payload in peer.messages(self.tag):
                        if kind == Kind.ABORT:
                            self._aborted(peer, payload)
                        if kind != Kind.EXPONENTS or step != dim:
                            raise TransportError(f"server {self.engine.home_of(peer)} sent "
                                                 f"{Kind(kind).name}"
                                                 " during the exponent exchange: it runs "
                                                 "another call or another version")
                        info = json.loads(bytes(payload[:start]))
                        got[peer.server] = (info, np.frombuffer(
                            payload[start:], dtype=np.uint8, count=count).copy())
                        break
            for info, their in got.values():
                lengths = [min(lengths[0], info["lengths"][0]),
                           max(lengths[1], info["lengths"][1])]
                codes |= set(info["codes"])
                if newer_generation(info["generation"], generation):
                    generation = info["generation"]
                if their.size == exponents.size:
                    exponents = np.maximum(exponents, their)
        if lengths[0] != lengths[1]:
            raise LengthMismatch(
                f"job {self.engine.job}: gradient lengths differ across the "
                f"{self.topology.num_servers} workers (this worker has {self.length} elements; "
                f"they range from {lengths[0]} to {lengths[1]}); nothing was summed")
        if len(codes) > 1:
            raise TransportError(f"job {self.engine.job}: the workers run different schedules "
                                 f"({', '.join(sorted(codes))}); give all of them the same "
                                 "--schedule")
        self.generation = generation
        return exponents.astype(np.int64)

    def _wait(self, peers: list[Peer], deadline: float, what: str, missing: list[int]) -> None:
        """Read from ``peers`` for a while; write to every neighbour that still has some of
        its messages to send: a level's EXPONENTS larger than a connection's pacing limit
        goes out in parts, and its tail must keep going out while this worker waits on the
        next level (it did not: the neighbours of that level waited 60 s for it, each on
        another, when the mixed schedule's limit fell below the exponents of 1M floats)."""
        if time.monotonic() > deadline:
            raise TransportError(
                f"job {self.engine.job} server {self.engine.home}: no answer in {what} from "
                f"server(s) {', '.join(map(str, missing))} within {self.engine.timeout:g} s: "
                "are all the job's workers running?")
        poll = select.poll()
        waited = {id(peer) for peer in peers}
        for peer in self.engine.mesh.all():
            events = ((select.POLLIN if id(peer) in waited else 0)
                      | (select.POLLOUT if peer.outbox and not peer.paced else 0))
            if events:
                poll.register(peer.sock, events)
        for fd, _event in poll.poll(20):
            del fd
        for peer in self.engine.mesh.all():
            if peer.outbox:
                peer.flush()
        for peer in peers:
            peer.fill()
            if peer.closed and not peer.inbox:
                raise WorkerLost(f"job {self.engine.job}: server {self.engine.home_of(peer)} "
                                 f"(level {peer.dim}) closed its connection during {what}: it "
                                 "stopped", {self.engine.home_of(peer)})

    # --- set-up of the steps -------------------------------------------------------------
    def _prepare(self) -> None:
        topo, engine = self.topology, self.engine
        self.stage = np.zeros(self.blocks, dtype=np.int8)
        self.final = np.zeros(self.blocks, dtype=bool)
        self.finals = 0
        self.incoming: dict[tuple[int, int], np.ndarray] = {}
        self.incount: dict[tuple[int, int], np.ndarray] = {}
        self.channels: dict[tuple[int, int], SwitchChannel] = {}
        self.route: dict[tuple[int, int], tuple[str, int, Range]] = {}  # (stripe, j) per block
        self.messages: dict[tuple, int] = {}  # outgoing message -> blocks not yet ready
        self.ranges: dict[tuple, list[tuple[Range, list[Peer]]]] = {}
        self.broadcast_left: dict[tuple[int, int], int] = {}
        self.sent_due: list[tuple[int, int]] = []  # (stripe, step) whose SENT waits
        self.repairs: dict[tuple[int, int, int], float] = {}
        self.done_sent = False
        # Per stripe: which blocks go how at each RS step; channels for switch steps.
        self.rs_owner: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        in_flight = nic_in_flight(self.schedule, engine.server)
        for p in range(topo.k):
            for j, dim in enumerate(self.rs_dims[p]):
                parts = self.layout.rs_parts(p, j, engine.server)
                owner = np.full(self.blocks, -1, dtype=np.int16)
                via_switch = np.zeros(self.blocks, dtype=bool)
                for i, (sw, host) in enumerate(parts):
                    owner[sw[0]:sw[1]] = i
                    owner[host[0]:host[1]] = i
                    via_switch[sw[0]:sw[1]] = True
                seq, owners = _interleaved([range(*sw) for sw, _host in parts])
                self.rs_owner[(p, j)] = (owner, via_switch)
                if seq:
                    self.channels[(p, dim)] = SwitchChannel(
                        self, engine.links[dim], p, seq, owners, engine.window,
                        in_flight[dim], in_order=j == 0)
                peers = {s.server: s for s in engine.mesh.neighbours(dim)}
                outgoing = []
                for i, (_sw, host) in enumerate(parts):
                    if i == self.me[dim] or not length(host):
                        continue
                    target = topo.server_of(_replace(self.me, dim, i))
                    outgoing.append((host, [peers[target]]))
                self.ranges[(Kind.CONTRIB, p, j)] = outgoing
                mine = parts[self.me[dim]][1]
                if length(mine):
                    self.incoming[(p, j)] = np.zeros((self.blocks, VALUES_PER_PACKET),
                                                     dtype=np.int32)
                    self.incount[(p, j)] = np.zeros(self.blocks, dtype=np.int16)
            if self.ar_dim[p] is not None:
                piece = self.pieces[p][-1]
                if length(piece):
                    self.channels[(p, self.ar_dim[p])] = SwitchChannel(
                        self, engine.links[self.ar_dim[p]], p, list(range(*piece)), None,
                        engine.window, in_flight[self.ar_dim[p]],
                        in_order=not self.rs_dims[p])
            for j, dim in enumerate(self.rs_dims[p]):
                own = self.pieces[p][j + 1]
                if dim not in self.ag_in_switch[p]:
                    continue
                if self.ag_in_switch[p][dim]:
                    self.broadcast_left[(p, j)] = length(own)
                elif length(own):
                    self.ranges[(Kind.FINAL, p, j)] = [(own, engine.mesh.neighbours(dim))]
        for key, ranges in self.ranges.items():
            for (start, stop), _peers in ranges:
                for first in range(start, stop, MESSAGE_BLOCKS):
                    self.messages[(*key, first)] = min(MESSAGE_BLOCKS, stop - first)
        for p in range(topo.k):
            for j in range(len(self.rs_dims[p])):
                if not self.broadcast_left.get((p, j), 1):
                    self._sent_all(p, j)
        for p in range(topo.k):
            start, stop = self.layout.stripe(p)
            for block in range(start, stop):
                self._enter(p, block, 0)

    # --- block flow ----------------------------------------------------------------------
    def _enter(self, p: int, block: int, j: int) -> None:
        """``block`` of stripe ``p`` is ready as the input of the stripe's RS step ``j`` (or
        of its AR / its end when ``j`` is past the last RS)."""
        self.stage[block] = j
        dims = self.rs_dims[p]
        if j < len(dims):
            dim = dims[j]
            owner, via_switch = self.rs_owner[(p, j)]
            if via_switch[block]:
                self.channels[(p, dim)].ready(block)
            elif owner[block] == self.me[dim]:
                self._try_reduce(p, j, block)
            else:
                self._message_ready(Kind.CONTRIB, p, j, block)
        elif self.ar_dim[p] is not None:
            self.channels[(p, self.ar_dim[p])].ready(block)
        else:
            self._finalise(p, block, self.acc[block])

    def _try_reduce(self, p: int, j: int, block: int) -> None:
        count = self.incount[(p, j)]
        if count[block] == self.topology.n - 1 and self.stage[block] == j:
            count[block] = -1  # used
            self.acc[block] += self.incoming[(p, j)][block]
            self._enter(p, block, j + 1)

    def reduced(self, p: int, dim: int, block: int, values: np.ndarray) -> None:
        """A switch channel delivered the sum of ``block`` to this server."""
        if self.ar_dim[p] == dim:
            self._finalise(p, block, values)
        else:
            self.acc[block] = values
            self._enter(p, block, self.rs_dims[p].index(dim) + 1)

    def _finalise(self, p: int, block: int, values: np.ndarray) -> None:
        if self.final[block]:
            return
        self.acc[block] = values
        self.final[block] = True
        self.finals += 1
        if self.finals == 1:
            self.stats.first_result = time.monotonic()
        if self.finals == self.blocks:
            self.stats.last_result = time.monotonic()
        if self.progress is not None and self.finals % 1024 == 0:
            self.progress(self.finals, self.blocks)
        for j in range(self.depth(p, block)):
            dim = self.rs_dims[p][j]
            if self.ag_in_switch[p].get(dim):
                self._broadcast(p, j, dim, block)
            else:
                self._message_ready(Kind.FINAL, p, j, block)

    def _broadcast(self, p: int, j: int, dim: int, block: int) -> None:
        self.engine.links[dim].send(HEADER_STRUCT.pack(
            PacketType.BROADCAST, 0, stripe_job_id(self.engine.job, p), self.me[dim], 0, 0,
            int(self.exponents[block]), self.valid_count(block), self.generation,
            block * VALUES_PER_PACKET) + self.acc[block].astype(_BE).tobytes())
        self.stats.frames_sent += 1
        self.stats.broadcasts += 1
        self.broadcast_left[(p, j)] -= 1
        if self.broadcast_left[(p, j)] == 0:
            self._sent_all(p, j)

    def _sent_all(self, p: int, j: int) -> None:
        """Say SENT once the broadcasts have left: while some still wait for room in the
        kernel (the NIC's outbox), the SENT waits too (``_send_due``), so that a copy missing
        after it arrives is lost, not late."""
        self.sent_due.append((p, j))
        self._send_due()

    def _send_due(self) -> None:
        waiting = []
        for p, j in self.sent_due:
            dim = self.rs_dims[p][j]
            if self.engine.links[dim].outbox:
                waiting.append((p, j))
                continue
            for peer in self.engine.mesh.neighbours(dim):
                peer.send(Kind.SENT, self.tag, p, j)
        self.sent_due = waiting

    def _message_ready(self, kind: Kind, p: int, j: int, block: int) -> None:
        for (start, stop), peers in self.ranges[(kind, p, j)]:
            if start <= block < stop:
                first = start + (block - start) // MESSAGE_BLOCKS * MESSAGE_BLOCKS
                key = (kind, p, j, first)
                self.messages[key] -= 1
                if self.messages[key] == 0:
                    last = min(stop, first + MESSAGE_BLOCKS)
                    payload = self.acc[first:last].astype(_BE).tobytes()
                    for peer in peers:
                        peer.send(kind, self.tag, p, j, first, last - first, payload)
                return

    # --- what arrives --------------------------------------------------------------------
    def _on_frame(self, level: int, buffer: bytearray, size: int) -> None:
        if size < HEADER_BYTES:
            return
        (ptype, version, job, _worker, _owner, slot, _exp, _count, generation, offset) = \
            HEADER_STRUCT.unpack_from(buffer)
        link = self.engine.links[level]
        link.last_heard, link.asked = time.monotonic(), 0.0
        p, rest = divmod(job - self.engine.job, STRIPE_JOB_STRIDE)
        if rest or not 0 <= p < self.topology.k:
            return
        if ptype == PacketType.GENERATION:
            if newer_generation(generation, self.generation):
                raise TransportError(
                    f"job {self.engine.job} server {self.engine.home}: switch "
                    f"{self.engine.links[level].switch_ip} (level {level}) has stripe {p}'s job "
                    f"at generation {generation}, newer than this call's {self.generation}: "
                    "another run of this job started there, so this call is abandoned")
        elif ptype == PacketType.BROADCAST:
            block = offset // VALUES_PER_PACKET
            if (generation == self.generation and size >= PAYLOAD_BYTES
                    and offset % VALUES_PER_PACKET == 0
                    and self.layout.stripe(p)[0] <= block < self.layout.stripe(p)[1]
                    and level in self.rs_dims[p]):
                values = np.frombuffer(buffer, dtype=_BE, count=VALUES_PER_PACKET,
                                       offset=HEADER_BYTES)
                self._finalise(p, block, values)
        elif ptype in _RESULTS:
            channel = self.channels.get((p, level))
            if channel is not None:
                channel.on_result(ptype, version, slot, offset, generation, buffer, size)
        elif ptype == PacketType.PENDING:
            channel = self.channels.get((p, level))
            if channel is not None:
                channel.on_pending(version, slot, offset, generation)

    def _on_message(self, peer: Peer, kind: int, p: int, j: int, start: int, count: int,
                    payload: memoryview) -> None:
        if kind in (Kind.CONTRIB, Kind.FINAL):
            if p >= self.topology.k or start + count > self.blocks:
                return
            values = np.frombuffer(payload, dtype=_BE).reshape(-1, VALUES_PER_PACKET)[:count]
            if kind == Kind.CONTRIB:
                if (p, j) not in self.incount:
                    return
                self.incoming[(p, j)][start:start + count] += values
                self.incount[(p, j)][start:start + count] += 1
                for block in range(start, start + count):
                    self._try_reduce(p, j, block)
            else:
                for i, block in enumerate(range(start, start + count)):
                    self._finalise(p, block, values[i])
        elif kind == Kind.SENT:
            self.repairs[(p, j, peer.server)] = time.monotonic() + self._grace()
        elif kind == Kind.ABORT:
            self._aborted(peer, payload)
        elif kind == Kind.NEED:
            wanted = np.frombuffer(payload, dtype=">u4").reshape(-1, 2)
            for first, last in wanted:
                for start, stop in _runs(np.flatnonzero(self.final[first:last]) + first):
                    for block in range(start, stop, MESSAGE_BLOCKS):
                        end = min(stop, block + MESSAGE_BLOCKS)
                        peer.send(Kind.FINAL, self.tag, p, j, block, end - block,
                                  self.acc[block:end].astype(_BE).tobytes())

    def _resend(self, now: float) -> None:
        """Re-send overdue slots, longest-waiting first, within each NIC's budget."""
        for link in self.engine.links:
            rto = self.rto[link.level]
            channels = [c for (_p, level), c in self.channels.items() if level == link.level]
            draining = [channel.draining() for channel in channels]
            overdue = sorted((entry for channel, end in zip(channels, draining, strict=True)
                              for entry in channel.overdue(now, rto, end)),
                             key=lambda entry: entry[0])
            if not overdue:
                continue
            # The end of the call on this NIC (its channels have sent everything): the link
            # has room, and each slot's own back-off bounds its re-sends, so no budget is
            # needed. (Not mid-call: there late slots often wait for lagging co-workers.)
            ending = all(draining)
            for _sent, channel, slot, why in overdue:
                if not ending:
                    if link.budget >= 1:
                        link.budget -= 1
                    elif now - link.last_forced > rto.value:
                        link.last_forced = now
                    else:
                        break
                channel.resend(slot, now, why)

    def _watch_switches(self, now: float) -> None:
        """A switch that owes answers and has sent nothing for ``SWITCH_SILENCE`` is asked
        whether it is alive (a GENERATION question, which it answers whatever the other
        workers do); no answer within ``SWITCH_DEADLINE`` more: it is down, and the call fails
        at once instead of waiting out its timeout."""
        for link in self.engine.links:
            owed = [c for (_p, level), c in self.channels.items()
                    if level == link.level and c.waiting()]
            # Broadcast copies still missing come through this switch too (their repairs over
            # TCP as well): wait for them the same way.
            owed_copies = [p for p, j, _server in self.repairs if self.rs_dims[p][j] == link.level]
            # On a slow, saturated link a question and its answer wait in full queues: the
            # bounds grow with the answer times this NIC sees.
            rto = self.rto[link.level].value
            if (not (owed or owed_copies)
                    or now - link.last_heard < max(SWITCH_SILENCE, 4 * rto)):
                continue
            deadline = max(SWITCH_DEADLINE, 3 * rto)
            if not link.asked:
                link.asked, link.questions = now, 0
            elif now - link.asked > deadline:
                waiting = "; ".join([f"{c.name}: {c.waiting()} slot(s) waiting" for c in owed]
                                    + [f"stripe {p}: broadcasts missing" for p in owed_copies])
                topo = self.topology
                switch = topo.switch_at(link.level, topo.switch_index(self.engine.server,
                                                                      link.level))
                raise PartFailed(
                    f"job {self.engine.job} server {self.engine.home}: switch {switch.name} "
                    f"({link.switch_ip}, level {link.level}) stopped answering: nothing from it "
                    f"for {now - link.last_heard:.1f} s, not even to a question whether it is "
                    f"alive ({waiting}): it is down or cut off",
                    {(link.level, switch.index)})
            if now - link.asked >= link.questions * deadline / 4:  # four questions
                link.questions += 1
                stripe = owed[0].stripe if owed else owed_copies[0]
                link.send(generation_question(stripe_job_id(self.engine.job, stripe),
                                              self.me[link.level]))

    def _grace(self) -> float:
        """How long after a neighbour's SENT a broadcast copy of its that has not come is
        asked for again. The copies left before the SENT, through the same queues (its link
        up, the switch, this server's link down), so one missing then is lost, not late; half
        an RTO (one typical answer time) leaves room for reordering."""
        return max(0.05, max(rto.value for rto in self.rto) / 2)

    def _repair(self, now: float) -> None:
        """Ask a neighbour again for the broadcasts of its that never arrived."""
        for key, due in list(self.repairs.items()):
            if due > now:
                continue
            p, j, server = key
            dim = self.rs_dims[p][j]
            digit = self.topology.digits(server)[dim]
            start, stop = split(self.pieces[p][j], self.topology.n)[digit]
            missing = np.flatnonzero(~self.final[start:stop]) + start
            if not missing.size:
                del self.repairs[key]
                continue
            # Asked again after a while if still missing (an answer only covers what was final
            # when the question came).
            self.repairs[key] = now + 2 * self._grace()
            runs = _runs(missing)
            peer = self.engine.mesh.peers[(dim, server)]
            peer.send(Kind.NEED, self.tag, p, j, 0, len(runs),
                      np.array(runs, dtype=">u4").tobytes())
            self.stats.repairs_asked += int(missing.size)

    # --- the event loop ------------------------------------------------------------------
    def _finished(self) -> bool:
        peers = self.engine.mesh.all()
        return (self.done_sent
                and all(c.done for c in self.channels.values())
                and all(p.done for p in peers)
                and not any(p.outbox for p in peers)
                and not any(link.outbox for link in self.engine.links))

    def _loop(self, started: float) -> None:
        engine = self.engine
        links = engine.links
        peers = engine.mesh.all()
        by_fd = {link.sock.fileno(): link for link in links}
        peer_fd = {peer.sock.fileno(): peer for peer in peers}
        buffer = bytearray(PAYLOAD_BYTES + 64)
        next_scan = time.monotonic() + 0.01
        deadline = started + engine.timeout
        # The exponent exchange may already have read messages of this call into an inbox
        # (a neighbour that finished it first starts sending at once); poll() will not report
        # those again, so take them now.
        for peer in peers:
            for message in peer.messages(self.tag):
                self._on_message(peer, *message)
        poll = select.poll()
        for link in links:
            poll.register(link.sock, select.POLLIN)
            link.last_heard, link.asked = time.monotonic(), 0.0
        watched = {}  # peer fd -> the events it is registered for
        while not self._finished():
            now = time.monotonic()
            if now > deadline:
                self._fail(now - started)
            if self.finals == self.blocks and not self.done_sent:
                self.done_sent = True
                for peer in peers:
                    peer.send(Kind.DONE, self.tag)
            for fd, peer in peer_fd.items():
                self._check_open(peer)
                if peer.paced:  # held back by its pacing, not by the socket: try again now
                    peer.flush()
                wanted = 0 if peer.closed else select.POLLIN | (
                    select.POLLOUT if peer.outbox and not peer.paced else 0)
                if watched.get(fd, 0) != wanted:
                    if fd in watched:
                        poll.unregister(fd)
                        del watched[fd]
                    if wanted:
                        poll.register(fd, wanted)
                        watched[fd] = wanted
            events = poll.poll(max(0.0, min(next_scan - now, 0.01)) * 1000)
            for fd, event in events:
                link = by_fd.get(fd)
                if link is not None:
                    recv_into = link.sock.recv_into
                    for _ in range(4096):
                        try:
                            size = recv_into(buffer)
                        except (BlockingIOError, InterruptedError):
                            break
                        self._on_frame(link.level, buffer, size)
                    continue
                peer = peer_fd[fd]
                if event & select.POLLOUT:
                    peer.flush()
                if event & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    peer.fill()
                    for message in peer.messages(self.tag):
                        self._on_message(peer, *message)
                    self._check_open(peer)
            for link in links:
                link.drain()
            if self.sent_due:
                self._send_due()
            now = time.monotonic()
            if now >= next_scan:
                self._resend(now)
                self._repair(now)
                self._watch_switches(now)
                next_scan = now + min(rto.value for rto in self.rto) / 2
        if self.progress is not None:
            self.progress(self.blocks, self.blocks)

    def _aborted(self, peer: Peer, payload: memoryview) -> None:
        reason, broken, lost = abort_reason(payload)
        message = (f"job {self.engine.job} server {self.engine.home}: server "
                   f"{self.engine.home_of(peer)} (level {peer.dim}) gave up on the call: {reason}")
        if broken:
            raise PartFailed(message, broken)
        if lost:
            raise WorkerLost(message, lost)
        raise TransportError(message)

    def _check_open(self, peer: Peer) -> None:
        if peer.closed and not peer.done:
            gone = self.engine.home_of(peer)
            raise WorkerLost(
                f"job {self.engine.job} server {self.engine.home}: server {gone} "
                f"(level {peer.dim}) closed its connection mid-call: it stopped "
                f"({self.blocks - self.finals} of {self.blocks} blocks missing)", {gone})

    def _fail(self, waited: float) -> None:
        engine = self.engine
        stuck = [f"{c.name}: {c.waiting()} slot(s) waiting for switch {c.nic.switch_ip}"
                 for c in self.channels.values() if not c.done and c.waiting()]
        silent = [f"{engine.home_of(p)} (level {p.dim})" for p in engine.mesh.all() if not p.done]
        raise TransportError(
            f"job {engine.job} server {engine.home}: {self.blocks - self.finals} of "
            f"{self.blocks} blocks still missing after {waited:.1f} s"
            + (f"; {'; '.join(stuck)}" if stuck else "")
            + (f"; no DONE yet from server(s) {', '.join(silent)}" if silent else "")
            + ": a worker, a switch or a link stopped")


def _interleaved(parts: list[range]) -> tuple[list[int], list[int]]:
    """(blocks, owner of each) taking the parts' blocks in turn: every owner's sums come back
    at the same pace, so every group of the next step gets its input from the start (one
    part after another, the last part's owners would start their next step at the end, their
    links idle meanwhile and busy after everybody else's)."""
    seq: list[int] = []
    owners: list[int] = []
    for position in range(max((len(part) for part in parts), default=0)):
        for i, part in enumerate(parts):
            if position < len(part):
                seq.append(part[position])
                owners.append(i)
    return seq, owners


def _runs(blocks: np.ndarray) -> list[tuple[int, int]]:
    """Sorted block numbers as contiguous [start, stop) runs."""
    if not blocks.size:
        return []
    breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(blocks, breaks)]


def _replace(digits: tuple[int, ...], dim: int, value: int) -> tuple[int, ...]:
    return (*digits[:dim], value, *digits[dim + 1:])
