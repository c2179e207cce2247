"""One allreduce of one worker on every NIC, as a state machine without I/O.

A ``Call`` never reads a clock or a socket: every input names the time it happens (``now``),
and what it wants sent waits in ``frames`` (UDP datagrams per NIC level, to that NIC's switch)
and ``messages`` (encoded mesh messages per neighbour) until its driver takes them;
``next_wake()`` says when it needs ``on_timer`` next. The real engine (``hosts/engine.py``)
drives it from one event loop over sockets; the simulator (``simulation/``) drives many of
them over a simulated network in virtual time, so the code under test is the code that runs.

A call runs in phases:

1. **Generation.** A worker that does not know the job's generation (a fresh one, or after a
   failed call) asks each switch job it aggregates in (a GENERATION question), again every
   0.2 s, for ``start_timeout``.
2. **Exponents.** Every block's max exponent over all N servers, by a max-exchange with the
   neighbours of each dimension in turn (k rounds); it also checks that every worker has the
   same gradient length and runs the same schedule, agrees the call's generation (newer than
   anything an aborted call left in the switches, docs/PROTOCOL.md), and it is the call's
   barrier. Every worker then quantises with that global exponent for N contributions, so
   every partial sum, at any level, is an exact int32 that cannot overflow
   (``hosts/quantize.py``): relays forward integers and the error bound is the single
   switch's for N workers.
3. **Steps, pipelined per block** (``bml/schedule.py``): a block enters a stripe's next step
   the moment its previous one delivers it. Steps in the switch run as a ``SwitchChannel``: a
   window of slots of the stripe's switch job, one per (stripe, level), with per-slot timers
   and re-sends (the switch answers a re-sent contribution with the stored sum); it uses more
   slots than it keeps frames in flight, so slots waiting on a loss do not idle the link.
   Host-based steps send messages over the mesh. All-gather in the switch is a BROADCAST that
   the switch copies to the other n-1 servers; a copy that was lost is asked for again (NEED)
   once its sender said it has broadcast everything (SENT).
4. **Done.** A worker with the whole result says DONE to every neighbour and is complete when
   every neighbour said DONE to it (so nobody still needs a repair from it) and every switch
   slot it used is back on copy 0 (an even number of uses: the next call starts clean).

Failure detection runs through phases 2-4: a switch of this worker's that has sent nothing
for a while is asked whether it is alive; without an answer in time
(``hosts.recovery.switch_down``) the call fails with ``PartFailed`` naming its group, which
the driver re-plans around. A neighbour's closed connection fails it with ``WorkerLost``;
an ABORT from a neighbour carries the same news on. Once the sums exist, a failure ends the
call with them where it can instead (``_go_on_after``): a worker that misses blocks asks a
neighbour that said DONE for them, one that holds them serves the neighbours it can reach,
and neither waits for a neighbour the failure cut off or that fell silent
(docs/PROTOCOL.md, "A failure at the end"). Every phase is bounded (``start_timeout``,
``timeout``).
"""

from __future__ import annotations

import enum
import json
import zlib
from collections.abc import Callable
from functools import partial

import numpy as np

from bml.protocol import (
    EXPONENT_NONE,
    GENERATIONS,
    HEADER_BYTES,
    HEADER_STRUCT,
    LANE_DTYPE,
    PRIMING_OFFSET,
    RESULT_TYPES,
    PacketType,
    Wire,
    generation_question,
    newer_generation,
    width_mismatch,
)
from bml.schedule import (
    MESSAGE_BLOCKS,
    STRIPE_JOB_STRIDE,
    Layout,
    Op,
    Range,
    channel_slots,
    channel_window,
    length,
    nic_in_flight,
    split,
    stripe_job_id,
)
from hosts.buffers import CallBuffers
from hosts.errors import LengthMismatch, TransportError
from hosts.membership import Membership, PartFailed, PeerKey, WorkerLost
from hosts.mesh import Kind, abort_reason, encode_message
from hosts.quantize import block_exponents, dequantize_flat, quantize_blocks
from hosts.recovery import (
    GENERATION_ASK_EVERY,
    HEARTBEAT_EVERY,
    START_DEADLINE,
    NicState,
    SlotWindow,
    detection_time,
    question_wait,
    resend_overdue,
    scan_interval,
    switch_down,
)
from hosts.stats import CallStats


class SwitchChannel(SlotWindow):
    """One stripe's step in one switch: a window of the stripe's switch-job slots.

    Every member sends the same blocks in the same order (block i of ``blocks`` always uses
    slot i mod W, use i // W), each as soon as it is ready and its slot free, so the members'
    contributions meet in the same slot copy. ``owners`` says whose each block's sum is
    (reduce-scatter: the switch sends it to the owner, an ACK to the others); None means all
    get it (allreduce). ``in_order``: every member has every block ready from the start (a
    stripe's first step), so all send in the same order; only then does the channel use more
    of its ``window`` slots than its ``in_flight`` frames (``bml.schedule.channel_slots``),
    and only then is a later frame answered first evidence of a loss (a later step's blocks
    become ready in a different order on each member, as the step before delivers them).
    When a slot is re-sent is ``SlotWindow``'s (``hosts/recovery.py``)."""

    def __init__(self, call: Call, nic: NicState, stripe: int, blocks: list[int],
                 owners: list[int] | None, window: int, in_flight: int,
                 in_order: bool = True) -> None:
        self.call, self.stripe = call, stripe
        self.level = nic.level
        self.job = stripe_job_id(call.plan.job, stripe)
        self.me = call.me[nic.level]
        self.blocks = blocks
        self.owners = owners
        self.count = len(blocks)
        width = channel_window(self.count, channel_slots(window, in_flight, in_order))
        uses = [-(-(self.count - s) // width) for s in range(width)]
        level = nic.level
        super().__init__(nic, width, [u + (u & 1) for u in uses] if self.count else [0] * width,
                         in_flight, call.now, lambda frame: call.send_frame(level, frame),
                         call.stats, in_order=in_order)
        self.seq_of = {b: i for i, b in enumerate(blocks)}
        self.ready_flags = bytearray(self.count)
        self.name = f"stripe {stripe} on level {nic.level}"

    def ready(self, block: int) -> None:
        seq = self.seq_of[block]
        self.ready_flags[seq] = 1
        slot = seq % self.window
        if self.frames[slot] is None and self.next_use[slot] * self.window + slot == seq:
            self.launch(slot, self.call.now)

    def frame_of(self, slot: int, seq: int) -> bytes:
        use = self.next_use[slot]
        call = self.call
        if seq < self.count:
            block = self.blocks[seq]
            owner = self.owners[seq] if self.owners is not None else 0
            return b"".join((HEADER_STRUCT.pack(
                PacketType.DATA, use & 1, self.job, self.me, owner, slot,
                int(call.exponents[block]), call.wire.blocks, call.generation,
                block * call.wire.lanes), call.acc[block].astype(LANE_DTYPE)))
        # flush: every slot ends on an even number of uses
        return HEADER_STRUCT.pack(PacketType.DATA, use & 1, self.job, self.me, 0, slot,
                                  EXPONENT_NONE, call.wire.blocks, call.generation,
                                  PRIMING_OFFSET) + call.wire.zero_lanes

    def _expects(self, version: int, slot: int, offset: int, generation: int) -> int | None:
        """The sequence number of the use an answer with these fields is for, if it is the
        slot's use in flight; None for a late, stray or foreign answer."""
        if slot >= self.window or self.frames[slot] is None or generation != self.call.generation:
            return None
        use = self.next_use[slot]
        if version != use & 1:
            return None
        seq = slot + use * self.window
        expected = (self.blocks[seq] * self.call.wire.lanes if seq < self.count
                    else PRIMING_OFFSET)
        return seq if offset == expected else None

    def on_pending_frame(self, now: float, ptype: int, version: int, slot: int, offset: int,
                         generation: int) -> None:
        """A PENDING or MISSING answer: this worker's contribution is in, or is not."""
        if self._expects(version, slot, offset, generation) is None:
            return
        if ptype == PacketType.PENDING:
            self.on_pending(now, slot)
        else:
            self.on_missing(now, slot)

    def on_result(self, now: float, ptype: int, version: int, slot: int, offset: int,
                  generation: int, data: bytes | bytearray | memoryview) -> None:
        seq = self._expects(version, slot, offset, generation)
        if seq is None:
            return
        block = self.blocks[seq] if seq < self.count else -1
        mine = self.owners is None or (block >= 0 and self.owners[seq] == self.me)
        wire = self.call.wire
        if block >= 0 and mine and (ptype == PacketType.ACK or len(data) < wire.payload_bytes):
            return  # the owner needs the values
        self.answered(now, slot)
        if block >= 0 and mine:
            values = np.frombuffer(data, dtype=LANE_DTYPE, count=wire.lanes, offset=HEADER_BYTES)
            self.call.reduced(self.stripe, self.level, block, values)
        if not self.finished(slot):
            following = slot + self.next_use[slot] * self.window
            if following >= self.count or self.ready_flags[following]:
                self.launch(slot, now)
        self.release(now)


class Phase(enum.Enum):
    GENERATION = "asking the switches for the job's generation"
    EXPONENTS = "the exponent exchange"
    STEPS = "the steps"
    COMPLETE = "complete"
    FAILED = "failed"


class Call:
    """The state of one allreduce: its phase, blocks, channels, messages. No I/O.

    ``tag`` goes into every mesh message of this call (the driver keeps messages of the next
    call for it and drops late ones of the last). ``last_generation``: this worker's last
    call's generation if that call ended well, else None (ask the switches). ``backlog(level)``
    says whether frames the driver took for that NIC still wait for room in the kernel: a
    SENT waits for the broadcasts before it to leave, so a copy missing after it is lost.
    ``queued(neighbour)`` says whether messages to it still wait to leave this host (a paced
    connection's outbox): it may not have had this worker's DONE yet."""

    def __init__(self, plan: Membership, nics: list[NicState], flat: np.ndarray, tag: int,
                 last_generation: int | None, now: float, window: int, timeout: float,
                 start_timeout: float, wire: Wire,
                 progress: Callable[[int, int], None] | None = None,
                 backlog: Callable[[int], bool] | None = None,
                 buffers: CallBuffers | None = None,
                 queued: Callable[[PeerKey], bool] | None = None,
                 out: np.ndarray | None = None) -> None:
        self.plan = plan
        self.out = out  # where the sum goes (``dequantize_flat``), if the caller gave it
        self.buffers = buffers or CallBuffers()
        self.topology = plan.topology
        self.schedule = plan.schedule
        self.nics = nics
        self.flat = flat
        self.tag = tag & 0xFF
        self.now = now
        self.started = now
        self.window, self.timeout, self.start_timeout = window, timeout, start_timeout
        self.progress = progress
        self.backlog = backlog or (lambda _level: False)
        self.queued = queued or (lambda _key: False)
        self.frames: list[tuple[int, bytes]] = []  # (level, datagram) for the driver to send
        self.messages: list[tuple[PeerKey, bytes]] = []  # (neighbour, encoded message)
        self.result: np.ndarray | None = None
        self.error: TransportError | None = None
        self.failed_after_result: PartFailed | WorkerLost | None = None
        self.adopted: set[tuple[int, int]] = set()  # broken groups learnt in the exchange
        self.generation = 0  # in every frame of this call to a switch (agreed by the exchange)
        self.length = flat.size
        self.wire = wire  # the switches' lane width: a block is one packet's values
        self.blocks = wire.chunks(flat.size)
        self.stats = CallStats()
        self.layout = Layout(self.schedule, self.blocks)
        server = plan.server
        self.me = self.topology.digits(server)
        k = self.topology.k
        self.pieces = [self.layout.pieces(p, server) for p in range(k)]
        steps = [self.schedule.steps_of(p, server) for p in range(k)]
        self.rs_dims = [self.schedule.rs_dims(p, server) for p in range(k)]
        self.ar_dim = [next((s.dim for s in stripe if s.op is Op.AR), None) for stripe in steps]
        self.ag_in_switch = [{s.dim: bool(s.switch_share) for s in stripe if s.op is Op.AG}
                             for stripe in steps]
        self.done_from: set[PeerKey] = set()
        self.closed: set[PeerKey] = set()
        self.channels: dict[tuple[int, int], SwitchChannel] = {}
        self.repairs: dict[tuple[int, int, int], float] = {}
        self.next_scan = now
        for nic in nics:
            nic.last_heard, nic.asked, nic.questions = now, 0.0, 0
        # The exponent exchange: what each neighbour sent for it, and the messages of this
        # call that came after it before this worker finished its own exchange.
        self.exchange_dim = 0
        self.exchange_from: dict[PeerKey, tuple[dict, np.ndarray]] = {}
        self.early: list[tuple[PeerKey, tuple]] = []
        # A failure once some worker holds the whole sum (docs/PROTOCOL.md, "A failure at the
        # end"): the failure this call goes on in spite of, the neighbours that returned the
        # sum all the same (their ABORT said so) or went silent, when each neighbour was last
        # heard from and last sent anything, when a block last moved here, the salvages.
        self.failure: PartFailed | None = None
        self.failure_at = 0.0
        self.returned: set[PeerKey] = set()
        self.gone: set[PeerKey] = set()
        self.heard: dict[PeerKey, float] = {}  # (or when a message to it last waited here)
        self.told: dict[PeerKey, float] = {}
        self.moved = now
        self.salvages = 0
        self.salvage_due = 0.0
        self._guard(self._start, last_generation)

    # --- what the driver calls -----------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.phase in (Phase.COMPLETE, Phase.FAILED)

    def on_frame(self, now: float, level: int, data: bytes | bytearray | memoryview) -> None:
        """A datagram arrived on NIC ``level`` from its switch."""
        if not self.finished:
            self.now = now
            self._guard(self._on_frame, level, data)

    def on_message(self, now: float, key: PeerKey, kind: int, stripe: int, step: int,
                   start: int, count: int, payload: bytes | memoryview) -> None:
        """A whole mesh message of this call (its tag) from neighbour ``key``."""
        if not self.finished:
            self.now = now
            if kind != Kind.HERE:  # a HERE is too small to keep the down link busy
                self.nics[key[0]].delivered = now  # its down link delivers: answers wait
            self.heard[key] = now
            self._guard(self._on_message, key, (kind, stripe, step, start, count, payload))

    def on_closed(self, now: float, key: PeerKey) -> None:
        """Neighbour ``key``'s connection closed, after every message it sent was given."""
        if not self.finished:
            self.now = now
            self.closed.add(key)
            self._guard(self._check_open, key)

    def on_timer(self, now: float) -> None:
        if not self.finished:
            self.now = now
            self._guard(self._on_timer)

    def next_wake(self) -> float:
        """When ``on_timer`` is due next (inf once the call is finished)."""
        if self.finished:
            return float("inf")
        return min(self.next_scan, self.deadline)

    def on_sent(self, now: float) -> None:
        """The driver has handed every frame it took to its NICs (or their backlog): a SENT
        that waited for its broadcasts can go if they left."""
        if not self.finished and self.phase is Phase.STEPS and self.sent_due:
            self.now = now
            self._guard(self._send_due)

    def take_frames(self) -> list[tuple[int, bytes]]:
        frames, self.frames = self.frames, []
        return frames

    def take_messages(self) -> list[tuple[PeerKey, bytes]]:
        messages, self.messages = self.messages, []
        return messages

    # --- outputs -------------------------------------------------------------------------
    def send_frame(self, level: int, frame: bytes) -> None:
        self.frames.append((level, frame))
        self.stats.frames_sent += 1

    def send_message(self, key: PeerKey, kind: Kind, stripe: int = 0, step: int = 0,
                     start: int = 0, count: int = 0, payload: bytes | np.ndarray = b"") -> None:
        self.messages.append((key, encode_message(kind, self.tag, stripe, step, start, count,
                                                  payload)))
        self.told[key] = self.now

    def _guard(self, method: Callable, *args) -> None:
        """Run an input; a failure ends the call with it (the driver reads ``error``), unless
        the call can go on in spite of it (``_go_on_after``)."""
        try:
            method(*args)
        except (PartFailed, WorkerLost) as exc:
            if not (self.phase is Phase.STEPS and self._go_on_after(exc)):
                self.phase = Phase.FAILED
                self.error = exc
        except TransportError as exc:
            self.phase = Phase.FAILED
            self.error = exc

    def _go_on_after(self, failure: PartFailed | WorkerLost) -> bool:
        """Whether the call goes on (or completes) in spite of ``failure`` instead of running
        again. A re-run needs every worker, and one that holds every block's sum may return
        it at any moment, so once the sums exist the call ends with them where it can: a
        failed part, found here or told by a neighbour that returned its sum all the same,
        leaves this worker in the call while it holds the whole sum (it waits for the DONEs
        of the neighbours it can still reach, which may need blocks from it) or while a
        neighbour it can reach said DONE (it asks that one for the blocks it misses:
        ``_salvage``). The failure is then for the driver to act on before the next call
        (``failed_after_result``). A neighbour that runs the call again (its ABORT) takes this
        worker into the re-run, which needs everyone. A neighbour that left ends the call
        here too, but when this worker holds the whole sum and misses DONEs only from
        neighbours cut off by it: the sum is right and is the result."""
        if failure.rerun:
            return False
        if isinstance(failure, WorkerLost):
            if self.finals == self.blocks and self._only_lost_dones(failure):
                self.failed_after_result = failure
                self._complete()
                return True
            return False
        if self.failure is not None:
            failure = PartFailed(str(self.failure), self.failure.broken | failure.broken)
        if self.finals < self.blocks and not self._helpers(failure):
            return False
        if self.failure is None:
            self.failure_at = self.now
        self.failure = failure
        self._salvage(self.now)
        self._maybe_done()
        return True

    def _only_lost_dones(self, failure: WorkerLost) -> bool:
        """Whether every neighbour this worker still waits a DONE from left (``failure``).
        (A failed part's cut-off neighbours are ``cut_off``'s.)"""
        return all(key in self.done_from or self.home_of(key) in failure.lost
                   for key in self.plan.peers())

    # --- helpers -------------------------------------------------------------------------
    def who(self) -> str:
        return f"job {self.plan.job} server {self.plan.home}"

    def home_of(self, key: PeerKey) -> int:
        return self.plan.home_of(key[1])

    def depth(self, stripe: int, block: int) -> int:
        """The deepest piece of this server that holds ``block``."""
        depth = 0
        for j, (start, stop) in enumerate(self.pieces[stripe]):
            if start <= block < stop:
                depth = j
        return depth

    def _cut_levels(self, failure: PartFailed | None = None) -> set[int]:
        """This worker's levels whose group a failure broke: its switch there is down or its
        link cut, so its connections of that level too."""
        failure = failure or self.failure
        if failure is None:
            return set()
        return {level for level, index in failure.broken
                if index == self.topology.switch_index(self.plan.server, level)}

    def cut_off(self, key: PeerKey, failure: PartFailed | None = None) -> bool:
        """Whether nothing more can come from neighbour ``key`` this call."""
        return (key in self.gone or key in self.returned
                or key[0] in self._cut_levels(failure))

    def _helpers(self, failure: PartFailed | None = None) -> list[PeerKey]:
        """Neighbours that hold the whole sum (they said DONE), are still in the call (they
        wait for this worker's DONE) and can be reached."""
        return sorted(key for key in self.done_from if not self.cut_off(key, failure))

    def _detection(self) -> float:
        return max(detection_time(nic) for nic in self.nics)

    def _switch_name(self, level: int) -> str:
        topo = self.topology
        return topo.switch_at(level, topo.switch_index(self.plan.server, level)).name

    # --- phase 1: generation -------------------------------------------------------------
    def _start(self, last_generation: int | None) -> None:
        self.phase = Phase.GENERATION
        self.deadline = self.started + self.start_timeout
        self.asking = {(level, stripe_job_id(self.plan.job, p))
                       for level, p in self.plan.switch_jobs()}
        self.newest = 0
        self.answered_levels: set[int] = set()
        if last_generation is not None or not self.asking:
            self._start_exchange(last_generation or 0)
        else:
            self._ask_generation()

    def _ask_generation(self) -> None:
        for level, job in sorted(self.asking):
            self.send_frame(level, generation_question(job, self.me[level], self.wire))
        self.next_scan = self.now + GENERATION_ASK_EVERY

    def _generation_answer(self, level: int, job: int, generation: int) -> None:
        if (level, job) not in self.asking:
            return
        self.asking.discard((level, job))
        self.answered_levels.add(level)
        if newer_generation(generation, self.newest):
            self.newest = generation
        if not self.asking:
            self._start_exchange(self.newest)

    def _others_answered(self) -> bool:
        """Another switch of this worker's answered the call's first question: the job is set
        up, so one still silent is down (on a BCube; a star's one switch has no other)."""
        return bool(self.answered_levels) and self.topology.k > 1

    def _generation_given_up(self, now: float) -> bool:
        """Whether the switches still silent at the call's start are down: others of this
        worker's answered (the job is set up), and they were asked every
        ``GENERATION_ASK_EVERY`` for what a loaded switch may take at a start (as the
        exchange's watch, ``START_DEADLINE``, or three answer times), not the start timeout."""
        if not self._others_answered():
            return False
        wait = question_wait(self.nics, {level for level, _job in self.asking}, START_DEADLINE)
        return now - self.started >= min(wait, self.start_timeout)

    def _generation_timed_out(self) -> None:
        """Switches that never answered: if others of this worker's did, those are down or cut
        off (re-planned around); if none did, the job is most likely not set up."""
        silent = sorted({level for level, _job in self.asking})
        level, job = min(self.asking)
        if self._others_answered():
            broken = {(lvl, self.topology.switch_index(self.plan.server, lvl)) for lvl in silent}
            raise PartFailed(
                f"{self.who()}: switch(es) "
                f"{', '.join(self._switch_name(lvl) for lvl in silent)} did not answer at the "
                f"call's start within {self.now - self.started:.1f} s while the others did: "
                "down or cut off", broken)
        raise TransportError(
            f"{self.who()}: switch {self.nics[level].switch_ip}"
            f" (level {level}) did not answer for switch job {job} within "
            f"{self.start_timeout:g} s: is the switch up, and is job {self.plan.job} set up "
            "on it (bml-ctl job-add --servers all)?")

    # --- phase 2: the exponent exchange --------------------------------------------------
    def _start_exchange(self, last_generation: int) -> None:
        self.phase = Phase.EXPONENTS
        self.deadline = self.now + self.timeout
        self.next_scan = self.now + 0.05
        padded = self.buffers.get("padded", (self.blocks, self.wire.lanes), np.float32)
        values = padded.reshape(-1)
        values[:self.length] = self.flat
        values[self.length:] = 0
        self.padded = padded
        self.merged = block_exponents(padded).astype(np.uint8)
        self.lengths = [self.length, self.length]
        self.codes = {self.plan.base_code}
        self.broken = set(self.schedule.broken)
        self.proposed = (last_generation + 1) % GENERATIONS
        self._send_exponents()
        self._advance_exchange()

    def _send_exponents(self) -> None:
        dim = self.exchange_dim
        head = json.dumps({"lengths": self.lengths, "codes": sorted(self.codes),
                           "broken": sorted(self.broken),
                           "generation": self.proposed}).encode()
        # Compressed: a block's exponent is mostly one of two or three values (a gradient's
        # blocks are alike), so 1 byte per block shrinks about tenfold, and under loss an
        # exchange of one TCP segment per neighbour loses a segment (a TCP timeout before
        # any block goes out) a tenth as often.
        body = head + zlib.compress(self.merged.tobytes(), 1)
        for key in self.plan.neighbours(dim):
            self.send_message(key, Kind.EXPONENTS, 0, dim, len(head), self.merged.size, body)
        self._trail(self.plan.neighbours(dim))

    def _trail(self, keys: list[PeerKey]) -> None:
        """A HERE behind the message just queued to each of ``keys`` (EXPONENTS, DONE): that
        message is the last on its connection for a while, so if it is lost, TCP finds out
        only by its timeout, which the queues of the others' first windows lengthen (in the
        emulation at 5% loss, a lost segment of the exchange held a 500K-float call 200 ms,
        in five of eleven calls). A segment behind it is SACKed instead, and the sender
        re-sends the lost one within a round trip (RACK). The two go as two segments: the
        driver writes each message as it comes, and the first has left when the second is
        written."""
        for key in keys:
            self.send_message(key, Kind.HERE)

    def _exchange_message(self, key: PeerKey, message: tuple) -> None:
        kind, _stripe, step, start, count, payload = message
        if key in self.exchange_from:
            self.early.append((key, (kind, _stripe, step, start, count, bytes(payload))))
            return
        if kind != Kind.EXPONENTS or step != key[0]:
            raise TransportError(f"server {self.home_of(key)} sent {Kind(kind).name}"
                                 " during the exponent exchange: it runs "
                                 "another call or another version")
        info = json.loads(bytes(payload[:start]))
        their = None
        if count == self.blocks:  # else the lengths differ: _exchange_done says so
            inflate = zlib.decompressobj()
            try:
                raw = inflate.decompress(bytes(payload[start:]), count)
            except zlib.error:
                raw = b""
            if len(raw) != count or not inflate.eof:
                raise TransportError(f"server {self.home_of(key)} sent exponents that do not"
                                     f" inflate to its {count} blocks: another version?")
            their = np.frombuffer(raw, dtype=np.uint8)
        self.exchange_from[key] = (info, their)
        if self.phase is Phase.EXPONENTS:
            self._advance_exchange()

    def _advance_exchange(self) -> None:
        """Merge each dimension's answers once all are in, then go on to the next."""
        k = self.topology.k
        while self.exchange_dim < k:
            peers = self.plan.neighbours(self.exchange_dim)
            if any(key not in self.exchange_from for key in peers):
                return
            for key in peers:
                info, their = self.exchange_from[key]
                self.lengths = [min(self.lengths[0], info["lengths"][0]),
                                max(self.lengths[1], info["lengths"][1])]
                self.codes |= set(info["codes"])
                self.broken |= {(int(level), int(index))
                                for level, index in info.get("broken", ())}
                if newer_generation(info["generation"], self.proposed):
                    self.proposed = info["generation"]
                if their is not None:
                    self.merged = np.maximum(self.merged, their)
            self.exchange_dim += 1
            if self.exchange_dim < k:
                self._send_exponents()
        self._exchange_done()

    def _exchange_done(self) -> None:
        if self.lengths[0] != self.lengths[1]:
            raise LengthMismatch(
                f"job {self.plan.job}: gradient lengths differ across the "
                f"{self.topology.num_servers} workers (this worker has {self.length} elements; "
                f"they range from {self.lengths[0]} to {self.lengths[1]}); nothing was summed")
        if len(self.codes) > 1:
            raise TransportError(f"job {self.plan.job}: the workers run different schedules "
                                 f"({', '.join(sorted(self.codes))}); give all of them the same "
                                 "--schedule")
        self._adopt_broken()
        self.generation = self.proposed
        self.exponents = self.merged.astype(np.int64)
        self.stats.exponent_seconds = self.now - self.started
        n_total = self.topology.num_servers
        self.acc = quantize_blocks(self.padded, self.exponents, n_total,
                                   out=self.buffers.get("sums", self.padded.shape, np.int32),
                                   work=self.padded)
        del self.padded
        self.phase = Phase.STEPS
        self.steps_started = self.now
        self.deadline = self.started + self.timeout
        self._prepare()
        early, self.early = self.early, []
        for key, message in early:
            self._step_message(key, message)
        self._maybe_done()

    def _adopt_broken(self) -> None:
        """Groups another worker knows are broken (it found its switch dead, at this call's
        start or at its mesh's) and this one did not: outside them this worker's own steps
        are the same either way (``Schedule.steps_of``), so it takes them over and goes on
        (``adopted``, for its later calls); inside one, it re-plans like every failure."""
        new = self.broken - set(self.schedule.broken)
        if not new:
            return
        mine = {(level, self.topology.switch_index(self.plan.server, level))
                for level in range(self.topology.k)}
        names = ", ".join(self.topology.switch_at(*group).name for group in sorted(new))
        if new & mine:
            raise PartFailed(f"{self.who()}: the other workers found switch(es) {names} down",
                             new)
        self.adopted = new

    # --- phase 3: set-up of the steps ----------------------------------------------------
    def _prepare(self) -> None:
        topo, plan = self.topology, self.plan
        self.stage = np.zeros(self.blocks, dtype=np.int8)
        self.final = np.zeros(self.blocks, dtype=bool)
        self.finals = 0
        self.incoming: dict[tuple[int, int], np.ndarray] = {}
        self.incount: dict[tuple[int, int], np.ndarray] = {}
        # (stripe, step) -> the blocks this server reduces from its neighbours' CONTRIBs:
        # its host part of the step (its switch part goes through the switch)
        self.reducing: dict[tuple[int, int], Range] = {}
        self.messages_left: dict[tuple, int] = {}  # outgoing message -> blocks not yet ready
        self.ranges: dict[tuple, list[tuple[Range, list[PeerKey]]]] = {}
        self.broadcast_left: dict[tuple[int, int], int] = {}
        self.sent_due: list[tuple[int, int]] = []  # (stripe, step) whose SENT waits
        self.done_sent = False
        # Per stripe: which blocks go how at each RS step; channels for switch steps.
        self.rs_owner: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        in_flight = nic_in_flight(self.schedule, plan.server,
                                  frame_bytes=self.wire.frame_bytes)
        for p in range(topo.k):
            for j, dim in enumerate(self.rs_dims[p]):
                parts = self.layout.rs_parts(p, j, plan.server)
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
                        self, self.nics[dim], p, seq, owners, self.window, in_flight[dim],
                        in_order=j == 0)
                outgoing = []
                for i, (_sw, host) in enumerate(parts):
                    if i == self.me[dim] or not length(host):
                        continue
                    target = topo.server_of(_replace(self.me, dim, i))
                    outgoing.append((host, [(dim, target)]))
                self.ranges[(Kind.CONTRIB, p, j)] = outgoing
                mine = parts[self.me[dim]][1]
                if length(mine):
                    incoming = self.buffers.get(f"incoming {p} {j}",
                                                (self.blocks, self.wire.lanes), np.int32)
                    incoming[mine[0]:mine[1]] = 0  # the only blocks sent here, and read
                    self.incoming[(p, j)] = incoming
                    self.reducing[(p, j)] = mine
                    self.incount[(p, j)] = np.zeros(self.blocks, dtype=np.int16)
            if self.ar_dim[p] is not None:
                piece = self.pieces[p][-1]
                if length(piece):
                    self.channels[(p, self.ar_dim[p])] = SwitchChannel(
                        self, self.nics[self.ar_dim[p]], p, list(range(*piece)), None,
                        self.window, in_flight[self.ar_dim[p]], in_order=not self.rs_dims[p])
            for j, dim in enumerate(self.rs_dims[p]):
                own = self.pieces[p][j + 1]
                if dim not in self.ag_in_switch[p]:
                    continue
                if self.ag_in_switch[p][dim]:
                    self.broadcast_left[(p, j)] = length(own)
                elif length(own):
                    self.ranges[(Kind.FINAL, p, j)] = [(own, plan.neighbours(dim))]
        for key, ranges in self.ranges.items():
            for (start, stop), _peers in ranges:
                for first in range(start, stop, MESSAGE_BLOCKS):
                    self.messages_left[(*key, first)] = min(MESSAGE_BLOCKS, stop - first)
        for p in range(topo.k):
            for j in range(len(self.rs_dims[p])):
                if not self.broadcast_left.get((p, j), 1):
                    self._sent_all(p, j)
        for p in range(topo.k):
            start, stop = self.layout.stripe(p)
            for block in range(start, stop):
                self._enter(p, block, 0)
        self.next_scan = self.now + 0.01

    # --- block flow ----------------------------------------------------------------------
    def _enter(self, p: int, block: int, j: int) -> None:
        """``block`` of stripe ``p`` is ready as the input of the stripe's RS step ``j`` (or
        of its AR / its end when ``j`` is past the last RS)."""
        self.stage[block] = j
        self.moved = self.now
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
        self.moved = self.now
        if self.finals == 1:
            self.stats.first_result = self.now
        if self.finals == self.blocks:
            self.stats.last_result = self.now
        if self.progress is not None and self.finals % 1024 == 0:
            self.progress(self.finals, self.blocks)
        for j in range(self.depth(p, block)):
            dim = self.rs_dims[p][j]
            if self.ag_in_switch[p].get(dim):
                self._broadcast(p, j, dim, block)
            else:
                self._message_ready(Kind.FINAL, p, j, block)

    def _broadcast(self, p: int, j: int, dim: int, block: int) -> None:
        self.send_frame(dim, b"".join((HEADER_STRUCT.pack(
            PacketType.BROADCAST, 0, stripe_job_id(self.plan.job, p), self.me[dim], 0, 0,
            int(self.exponents[block]), self.wire.blocks, self.generation,
            block * self.wire.lanes), self.acc[block].astype(LANE_DTYPE))))
        self.stats.broadcasts += 1
        self.broadcast_left[(p, j)] -= 1
        if self.broadcast_left[(p, j)] == 0:
            self._sent_all(p, j)

    def _sent_all(self, p: int, j: int) -> None:
        """Say SENT once the broadcasts have left: while some still wait for room in the
        kernel (the driver's ``backlog``), the SENT waits too (``_send_due``), so that a copy
        missing after it arrives is lost, not late."""
        self.sent_due.append((p, j))
        self._send_due()

    def _send_due(self) -> None:
        waiting = []
        for p, j in self.sent_due:
            dim = self.rs_dims[p][j]
            if self.backlog(dim) or any(level == dim for level, _frame in self.frames):
                waiting.append((p, j))
                continue
            for key in self.plan.neighbours(dim):
                self.send_message(key, Kind.SENT, p, j)
        self.sent_due = waiting

    def _message_ready(self, kind: Kind, p: int, j: int, block: int) -> None:
        for (start, stop), peers in self.ranges[(kind, p, j)]:
            if start <= block < stop:
                first = start + (block - start) // MESSAGE_BLOCKS * MESSAGE_BLOCKS
                key = (kind, p, j, first)
                self.messages_left[key] -= 1
                if self.messages_left[key] == 0:
                    last = min(stop, first + MESSAGE_BLOCKS)
                    payload = self.acc[first:last].astype(LANE_DTYPE)
                    for peer in peers:
                        self.send_message(peer, kind, p, j, first, last - first, payload)
                return

    # --- what arrives --------------------------------------------------------------------
    def _on_frame(self, level: int, data: bytes | bytearray | memoryview) -> None:
        if len(data) < HEADER_BYTES or level >= len(self.nics):
            return
        (ptype, version, job, _worker, _owner, slot, _exp, count, generation, offset) = \
            HEADER_STRUCT.unpack_from(data)
        nic = self.nics[level]
        nic.heard(self.now)
        p, rest = divmod(job - self.plan.job, STRIPE_JOB_STRIDE)
        if rest or not 0 <= p < self.topology.k:
            return
        if ptype == PacketType.GENERATION:
            mismatch = width_mismatch(count, self.wire, f"{self._switch_name(level)} "
                                      f"({nic.switch_ip}, level {level})")
            if mismatch:
                raise TransportError(f"{self.who()}: {mismatch}")
            if self.phase is Phase.GENERATION:
                self._generation_answer(level, job, generation)
            elif self.phase is Phase.STEPS and newer_generation(generation, self.generation):
                raise TransportError(
                    f"{self.who()}: switch {nic.switch_ip} (level {level}) has stripe {p}'s "
                    f"job at generation {generation}, newer than this call's "
                    f"{self.generation}: another run of this job started there, so this call "
                    "is abandoned")
            return
        if self.phase is not Phase.STEPS:
            return
        if ptype == PacketType.BROADCAST:
            lanes = self.wire.lanes
            block = offset // lanes
            if (generation == self.generation and len(data) >= self.wire.payload_bytes
                    and offset % lanes == 0
                    and self.layout.stripe(p)[0] <= block < self.layout.stripe(p)[1]
                    and level in self.rs_dims[p]):
                values = np.frombuffer(data, dtype=LANE_DTYPE, count=lanes, offset=HEADER_BYTES)
                self._finalise(p, block, values)
        elif ptype in RESULT_TYPES:
            channel = self.channels.get((p, level))
            if channel is not None:
                channel.on_result(self.now, ptype, version, slot, offset, generation, data)
        elif ptype == PacketType.PENDING or ptype == PacketType.MISSING:
            channel = self.channels.get((p, level))
            if channel is not None:
                channel.on_pending_frame(self.now, ptype, version, slot, offset, generation)
        self._maybe_done()

    def _on_message(self, key: PeerKey, message: tuple) -> None:
        if message[0] == Kind.HERE:
            return  # a sign of life (``heard``), nothing else
        if message[0] == Kind.ABORT:
            self._aborted(key, message[5])
        if self.phase is Phase.STEPS:
            self._step_message(key, message)
            self._maybe_done()
        else:
            self._exchange_message(key, message)

    def _step_message(self, key: PeerKey, message: tuple) -> None:
        kind, p, j, start, count, payload = message
        if kind in (Kind.CONTRIB, Kind.FINAL):
            if p >= self.topology.k or start + count > self.blocks:
                return
            values = np.frombuffer(payload, dtype=LANE_DTYPE).reshape(-1, self.wire.lanes)[:count]
            if kind == Kind.CONTRIB:
                mine = self.reducing.get((p, j))
                if mine is None or not mine[0] <= start <= start + count <= mine[1]:
                    return  # only the blocks this server reduces at the step are sent to it
                self.incoming[(p, j)][start:start + count] += values
                self.incount[(p, j)][start:start + count] += 1
                for block in range(start, start + count):
                    self._try_reduce(p, j, block)
            else:
                for i, block in enumerate(range(start, start + count)):
                    self._finalise(p, block, values[i])
        elif kind == Kind.SENT:
            self.repairs[(p, j, key[1])] = self.now + self._grace()
        elif kind == Kind.DONE:
            self.done_from.add(key)
            self.moved = max(self.moved, self.now)
        elif kind == Kind.ABORT:
            self._aborted(key, payload)
        elif kind == Kind.NEED:
            wanted = np.frombuffer(payload, dtype=">u4").reshape(-1, 2)
            for first, last in wanted:
                for start_, stop in _runs(np.flatnonzero(self.final[first:last]) + first):
                    for block in range(start_, stop, MESSAGE_BLOCKS):
                        end = min(stop, block + MESSAGE_BLOCKS)
                        self.send_message(key, Kind.FINAL, p, j, block, end - block,
                                          self.acc[block:end].astype(LANE_DTYPE))

    # --- timers --------------------------------------------------------------------------
    def _on_timer(self) -> None:
        now = self.now
        if now >= self.deadline:
            self._fail()
        if now < self.next_scan:
            return
        if self.phase is Phase.GENERATION:
            if self._generation_given_up(now):
                self._generation_timed_out()
            self._ask_generation()
            return
        self._watch_switches(now)
        if self.phase is Phase.STEPS:
            if self.sent_due:
                self._send_due()
            self._resend(now)
            self._repair(now)
            self._salvage(now)
            if self.done_sent:
                self._watch_neighbours(now)
            else:
                self._say_here(now)
            self._maybe_done()
        self.next_scan = now + scan_interval(self.nics)

    def _resend(self, now: float) -> None:
        """Re-send overdue slots, longest-waiting first, within each NIC's budget."""
        cut = self._cut_levels()
        for nic in self.nics:
            if nic.level not in cut:
                resend_overdue(nic, [c for (_p, level), c in self.channels.items()
                                     if level == nic.level], now)

    def _watch_switches(self, now: float) -> None:
        """Every switch of this worker's is watched (``hosts.recovery.switch_down``), not only
        those owing answers: a dead switch also stalls the broadcasts and the neighbours'
        messages that come through it. One that stopped answering fails the call at once
        (``PartFailed``, naming its group) instead of waiting out the call's timeout."""
        cut = self._cut_levels()
        for level in self.plan.live_levels():
            if level in cut:
                continue
            nic = self.nics[level]
            ask = partial(self.send_frame, level,
                          generation_question(self.plan.probe_job(), self.me[level], self.wire))
            owed = [f"{c.name}: {c.waiting()} slot(s) waiting"
                    for (_p, lvl), c in self.channels.items() if lvl == level and c.waiting()]
            if not switch_down(nic, now, ask, awaiting=bool(owed),
                               starting=self.phase is Phase.EXPONENTS):
                continue
            raise PartFailed(
                f"{self.who()}: switch {self._switch_name(level)} ({nic.switch_ip}, level "
                f"{level}) stopped answering: nothing from it for "
                f"{now - max(nic.last_heard, nic.delivered):.1f} s, not even to a question "
                f"whether it is alive, during {self.phase.value}"
                + (f" ({'; '.join(owed)})" if owed else "") + ": it is down or cut off",
                {(level, self.topology.switch_index(self.plan.server, level))})

    def _grace(self) -> float:
        """How long after a neighbour's SENT a broadcast copy of its that has not come is
        asked for again. The copies left before the SENT, through the same queues (its link
        up, the switch, this server's link down), so one missing then is lost, not late; half
        an RTO (one typical answer time) leaves room for reordering."""
        return max(0.05, max(nic.rto.value for nic in self.nics) / 2)

    def _repair(self, now: float) -> None:
        """Ask a neighbour again for the broadcasts of its that never arrived."""
        for key, due in list(self.repairs.items()):
            if due > now:
                continue
            p, j, server = key
            dim = self.rs_dims[p][j]
            digit = self.topology.digits(server)[dim]
            start, stop = split(self.pieces[p][j], self.topology.n)[digit]
            asked = self._ask_for_missing((dim, server), p, j, start, stop)
            if not asked:
                del self.repairs[key]
                continue
            # Asked again after a while if still missing (an answer only covers what was final
            # when the question came).
            self.repairs[key] = now + 2 * self._grace()
            self.stats.repairs_asked += asked

    def _ask_for_missing(self, key: PeerKey, p: int, j: int, start: int, stop: int) -> int:
        """A NEED to ``key`` for the blocks of [start, stop) not final here, as runs; how many
        (none: nothing sent). The answer is FINALs of those the neighbour holds."""
        missing = np.flatnonzero(~self.final[start:stop]) + start
        if missing.size:
            runs = _runs(missing)
            self.send_message(key, Kind.NEED, p, j, 0, len(runs),
                              np.array(runs, dtype=">u4").tobytes())
        return int(missing.size)

    def _salvage(self, now: float) -> None:
        """Ask a neighbour that holds the whole sum for the blocks still missing here once
        they stopped coming: at once after a failure, else once no block has moved for a
        failure's detection time (their sender may have returned the sum while a failure
        kept them from here). A neighbour that said DONE holds every block's sum and stays
        in its call until this worker's DONE comes (or it finds this worker gone), so it
        answers, as a repair, with FINALs; the next ask goes to the next such neighbour."""
        if self.finals == self.blocks or now < self.salvage_due:
            return
        helpers = self._helpers()
        stall = self._detection() + HEARTBEAT_EVERY  # a failure found elsewhere is told first
        if not helpers or (self.failure is None and now - self.moved < stall):
            return
        key = helpers[self.salvages % len(helpers)]
        for p in range(self.topology.k):
            self.stats.salvaged += self._ask_for_missing(key, p, 0, *self.layout.stripe(p))
        self.salvages += 1
        self.salvage_due = now + stall

    def _say_here(self, now: float) -> None:
        """While this worker misses blocks, a neighbour that said DONE (it watches for this
        worker's DONE: ``_watch_neighbours``) and that it has sent nothing for a while hears
        that it is still in the call (``HEARTBEAT_EVERY``)."""
        for key in self._helpers():
            if now - self.told.get(key, self.steps_started) >= HEARTBEAT_EVERY:
                self.send_message(key, Kind.HERE)

    def _watch_neighbours(self, now: float) -> None:
        """Once this worker holds the whole sum, a neighbour that owes its DONE and has sent
        nothing since this worker's DONE (not even a HERE, which one missing blocks sends a
        neighbour that said DONE while it sends it nothing else) for a failure's detection
        time is gone from the call: it returned the sum
        while a failure kept its DONE and its ABORT from here, or it is frozen. Nothing it
        could ask for would get here, so the call no longer waits for it."""
        limit = self._detection() + HEARTBEAT_EVERY
        for key in self.plan.peers():
            if key in self.done_from or self.cut_off(key):
                continue
            if self.queued(key):  # it may not have this worker's DONE yet
                self.heard[key] = now
            elif now - max(self.heard.get(key, 0.0), self.done_at) > limit:
                self.gone.add(key)

    # --- the end -------------------------------------------------------------------------
    def _maybe_done(self) -> None:
        """DONE to every neighbour once this worker holds the whole sum; complete once every
        neighbour that can still say DONE did, and every switch slot it used is back on
        copy 0 (but in a group that lost a member or its switch: those slots cannot end
        clean, and the next call's generation starts them afresh)."""
        if self.phase is not Phase.STEPS:
            return
        if self.finals == self.blocks and not self.done_sent:
            self.done_sent, self.done_at = True, self.now
            for key in self.plan.peers():
                self.send_message(key, Kind.DONE)
            self._trail(self.plan.peers())
        if not self.done_sent:
            return
        peers = self.plan.peers()
        if not all(key in self.done_from or self.cut_off(key) for key in peers):
            return
        broken = self._cut_levels() | {key[0] for key in peers if self.cut_off(key)}
        if any(level not in broken for level in self._sent_levels()):
            return
        if self.failure is not None and self.now < self.failure_at + self._settle():
            return
        if all(c.done or level in broken for (_p, level), c in self.channels.items()):
            self.failed_after_result = self.failure
            self._complete()

    def _settle(self) -> float:
        """How long a worker that found a failure at the end keeps its sum before it returns
        it: a worker elsewhere that found the same failure missing blocks with nobody to ask
        runs the call again, and its ABORT, relayed across the BCube (k + 1 hops at most),
        takes this one into the re-run, which needs everyone."""
        return (self.topology.k + 1) * max(nic.rto.value for nic in self.nics)

    def _sent_levels(self) -> set[int]:
        return {self.rs_dims[p][j] for p, j in self.sent_due}

    def _complete(self) -> None:
        self.phase = Phase.COMPLETE
        self.stats.seconds = self.now - self.started
        if self.failed_after_result is not None:
            self.stats.failure_after_sum = str(self.failed_after_result)
        self.stats.gone = sorted(self.home_of(key) for key in self.gone)
        self.result = dequantize_flat(self.acc, self.exponents, self.topology.num_servers,
                                      self.length, out=self.out)
        if self.progress is not None:
            self.progress(self.blocks, self.blocks)

    def _aborted(self, key: PeerKey, payload: bytes | memoryview) -> None:
        """A neighbour's ABORT: it runs the call again, so this worker must too, or
        (``summed``) it returned the sum in spite of a failure and needs nothing more."""
        why = abort_reason(payload)
        if why.summed:
            self.done_from.add(key)
            self.returned.add(key)
        message = (f"{self.who()}: server {self.home_of(key)} (level {key[0]}) "
                   + ("returned the sum, but saw a failure: " if why.summed
                      else "gave up on the call: ") + why.reason)
        if why.broken:
            raise PartFailed(message, set(why.broken), rerun=not why.summed)
        if why.lost:
            raise WorkerLost(message, set(why.lost), rerun=not why.summed)
        raise TransportError(message)

    def _check_open(self, key: PeerKey) -> None:
        if key in self.done_from:
            return
        gone = self.home_of(key)
        if self.phase is Phase.STEPS:
            raise WorkerLost(
                f"{self.who()}: server {gone} (level {key[0]}) closed its connection "
                f"mid-call: it stopped ({self.blocks - self.finals} of {self.blocks} blocks "
                "missing)", {gone})
        what = (f"the exponent exchange on level {self.exchange_dim}"
                if self.phase is Phase.EXPONENTS else self.phase.value)
        raise WorkerLost(f"job {self.plan.job}: server {gone} (level {key[0]}) closed its "
                         f"connection during {what}: it stopped", {gone})

    def _fail(self) -> None:
        if self.phase is Phase.GENERATION:
            self._generation_timed_out()
        if self.phase is Phase.EXPONENTS:
            dim = self.exchange_dim
            missing = [self.home_of(key) for key in self.plan.neighbours(dim)
                       if key not in self.exchange_from]
            raise TransportError(
                f"{self.who()}: no answer in the exponent exchange on level {dim} from "
                f"server(s) {', '.join(map(str, missing))} within {self.timeout:g} s: "
                "are all the job's workers running?")
        stuck = [f"{c.name}: {c.waiting()} slot(s) waiting for switch {c.nic.switch_ip}"
                 for c in self.channels.values() if not c.done and c.waiting()]
        silent = [f"{self.home_of(key)} (level {key[0]})" for key in self.plan.peers()
                  if key not in self.done_from]
        raise TransportError(
            f"{self.who()}: {self.blocks - self.finals} of "
            f"{self.blocks} blocks still missing after {self.now - self.started:.1f} s"
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
