"""One allreduce of one worker through one switch (a single-level job), without I/O.

A gradient of L float32 values is cut into C = ceil(L / 64) chunks; chunk c always uses slot
c mod W of the job's pool (W = the window), so up to W chunks are in flight. Each use of a slot
alternates its version bit (the switch's two copies). The exponent a chunk is quantised with
comes in-band: the frame for chunk c announces the worker's exponent of chunk c + W, the
next chunk on the same slot, and the result of chunk c brings back the max over all workers.
The first use of every slot is a priming round that announces the exponents of chunks
0..W-1; the priming of slot 0 also carries the worker's gradient length, so that lengths that
differ across workers are refused instead of mis-summed. Every call leaves every slot with an
even number of uses (a zero "flush" use is added where needed), so the next call, in this
process or another one, starts on copy 0, whose bitmap is then empty.

Generations (docs/PROTOCOL.md): every frame of a call carries its generation, one newer than
the last call's, or, for a fresh worker or after a failed call, one newer than the switch
says the job is at (a GENERATION question first), so whatever an aborted call left in the
slots is abandoned. If a co-worker started with a newer one, the switch answers this worker's
older frames with it: before the first answer this worker takes it over and re-sends its
priming; later it means another run of the job took over, and the call fails.

Loss recovery and the switch watch are the BCube call's (``hosts/recovery.py``); the workers
start on their own here (no exponent exchange synchronises them), so until the first answer
only one slot is re-sent. Every wait is bounded: the priming round by
``start_timeout``, the whole call by ``timeout``. The driver is the engine's loop
(``hosts/loop.py``); this class is what ``Call`` is for the BCube executor.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable

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
    length_lanes,
    newer_generation,
    width_mismatch,
)
from hosts.errors import LengthMismatch, TransportError
from hosts.quantize import block_exponents, dequantize_flat, quantize_to_wire
from hosts.recovery import (
    GENERATION_ASK_EVERY,
    NicState,
    SlotWindow,
    resend_overdue,
    scan_interval,
    switch_down,
)
from hosts.stats import CallStats


class Phase(enum.Enum):
    GENERATION = "asking the switch for the job's generation"
    STEPS = "the aggregation"
    COMPLETE = "complete"
    FAILED = "failed"


class InBandWindow(SlotWindow):
    """The job's slots, carrying the chunks with their exponents in-band."""

    def __init__(self, call: SingleSwitchCall, now: float) -> None:
        window = call.window
        uses = [1 + -(-(call.chunks - s) // window) for s in range(window)]
        super().__init__(call.nic, window, [u + (u & 1) for u in uses], window, now,
                         lambda frame: call.send_frame(0, frame), call.stats,
                         in_order=True, one_slot_first=True)
        self.call = call
        self.next_exponent = [EXPONENT_NONE] * window  # the max exponent of the next chunk

    def chunk(self, slot: int) -> int:
        """What the slot's use in flight carries: a chunk, -1 the priming, -2 a flush."""
        use = self.next_use[slot]
        if use == 0:
            return -1
        chunk = slot + (use - 1) * self.window
        return chunk if chunk < self.call.chunks else -2

    def frame_of(self, slot: int, seq: int) -> bytes:
        call = self.call
        use = self.next_use[slot]
        version, job, me, generation = use & 1, call.job, call.worker, call.generation
        chunk = self.chunk(slot)
        wire = call.wire
        if chunk == -1:
            lanes = wire.zero_lanes
            if slot == 0:
                lanes = wire.values_struct.pack(*length_lanes(call.length),
                                                *[0] * (wire.lanes - 8))
            return HEADER_STRUCT.pack(PacketType.DATA, version, job, me, 0, slot,
                                      call.announce(slot), wire.blocks, generation,
                                      PRIMING_OFFSET) + lanes
        if chunk == -2:
            return HEADER_STRUCT.pack(PacketType.DATA, version, job, me, 0, slot,
                                      EXPONENT_NONE, wire.blocks, generation,
                                      PRIMING_OFFSET) + wire.zero_lanes
        e_max = self.next_exponent[slot]
        if call.own_exponents[chunk] > e_max:
            raise TransportError(
                f"job {job}: the switch announced max exponent {e_max} for chunk {chunk}, "
                f"below this worker's {call.own_exponents[chunk]}: the job's slots hold state "
                "from another run; reset the job (bml-ctl job-remove / job-add)")
        values = quantize_to_wire(call.blocks[chunk], e_max, call.workers)
        return HEADER_STRUCT.pack(PacketType.DATA, version, job, me, 0, slot,
                                  call.announce(chunk + self.window), wire.blocks,
                                  generation, chunk * wire.lanes) + values

    def expects(self, version: int, slot: int, offset: int) -> bool:
        """Whether an answer with these fields is for the slot's use in flight."""
        if slot >= self.window or self.frames[slot] is None:
            return False
        if version != self.next_use[slot] & 1:
            return False
        chunk = self.chunk(slot)
        return offset == (chunk * self.call.wire.lanes if chunk >= 0 else PRIMING_OFFSET)

    def restart(self, now: float) -> None:
        """Send every slot's use in flight again from scratch (a new generation)."""
        for slot, frame in enumerate(self.frames):
            if frame is not None:
                self.send(slot, self.frame_of(slot, 0), now)


class SingleSwitchCall:
    """One allreduce of worker ``worker`` of ``workers`` through one switch; no I/O.

    The driver's side is ``Call``'s: ``on_frame``/``on_timer`` with ``now``, ``frames`` to
    send (all on level 0), ``next_wake()``, and ``result`` or ``error`` at the end."""

    def __init__(self, job: int, worker: int, workers: int, nic: NicState, flat: np.ndarray,
                 last_generation: int | None, now: float, window: int, timeout: float,
                 start_timeout: float, wire: Wire,
                 progress: Callable[[int, int], None] | None = None,
                 out: np.ndarray | None = None) -> None:
        self.out = out  # where the sum goes (``dequantize_flat``), if the caller gave it
        self.job, self.worker, self.workers, self.nic = job, worker, workers, nic
        self.wire = wire  # the switch's lane width: a chunk is one packet's values
        self.now = self.started = now
        self.timeout, self.start_timeout = timeout, start_timeout
        self.progress = progress
        self.frames: list[tuple[int, bytes]] = []
        self.result: np.ndarray | None = None
        self.error: TransportError | None = None
        self.stats = CallStats()
        self.length = flat.size
        self.chunks = wire.chunks(flat.size)
        blocks = np.zeros((self.chunks, wire.lanes), dtype=np.float32)
        blocks.reshape(-1)[:self.length] = flat
        self.own_exponents = block_exponents(blocks)
        self.blocks = blocks  # float32: quantize_to_wire scales it exactly
        self.window = min(window, self.chunks)
        self.sums = np.zeros((self.chunks, wire.lanes), dtype=np.int32)
        self.max_exponents = np.zeros(self.chunks, dtype=np.int64)
        self.done_chunks = 0
        self.primed = 0
        self.generation = 0
        self.slots: InBandWindow | None = None
        self.next_scan = now
        nic.heard(now)
        if last_generation is None:
            self.phase = Phase.GENERATION
            self.asked = 0.0
            self._guard(self._ask_generation)
        else:
            self._guard(self._start, (last_generation + 1) % GENERATIONS)

    # --- what the driver calls -----------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.phase in (Phase.COMPLETE, Phase.FAILED)

    def on_frame(self, now: float, level: int, data: bytes | bytearray | memoryview) -> None:
        if not self.finished:
            self.now = now
            self._guard(self._on_frame, data)

    def on_timer(self, now: float) -> None:
        if not self.finished:
            self.now = now
            self._guard(self._on_timer)

    def next_wake(self) -> float:
        return float("inf") if self.finished else min(self.next_scan, self._deadline())

    def on_sent(self, now: float) -> None:
        """(Nothing waits for the frames to leave on one NIC.)"""

    def on_message(self, *_args) -> None:
        """(No mesh on one NIC.)"""

    def on_closed(self, *_args) -> None:
        """(No mesh on one NIC.)"""

    def take_frames(self) -> list[tuple[int, bytes]]:
        frames, self.frames = self.frames, []
        return frames

    def take_messages(self) -> list:
        return []

    def cut_off(self, key: object) -> bool:
        """(No neighbours on one NIC.)"""
        return False

    def send_frame(self, level: int, frame: bytes) -> None:
        self.frames.append((level, frame))
        self.stats.frames_sent += 1

    # --- the call ------------------------------------------------------------------------
    def _guard(self, method: Callable, *args) -> None:
        try:
            method(*args)
        except TransportError as exc:
            self.phase = Phase.FAILED
            self.error = exc

    def who(self) -> str:
        return f"job {self.job} worker {self.worker}"

    def announce(self, chunk: int) -> int:
        return int(self.own_exponents[chunk]) if chunk < self.chunks else EXPONENT_NONE

    def _deadline(self) -> float:
        if self.phase is Phase.STEPS and self.primed >= self.window:
            return self.started + self.timeout
        return self.started + self.start_timeout

    def _ask_generation(self) -> None:
        self.send_frame(0, generation_question(self.job, self.worker, self.wire))
        self.asked = self.now
        self.next_scan = self.now + GENERATION_ASK_EVERY

    def _start(self, generation: int) -> None:
        self.phase = Phase.STEPS
        self.generation = generation
        self.slots = InBandWindow(self, self.now)
        for slot in range(self.window):
            self.slots.launch(slot, self.now)
        self.next_scan = self.now + self.nic.rto.value / 2

    def _on_frame(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) < HEADER_BYTES:
            return
        (ptype, version, job, _w, _o, slot, exponent, count, generation, offset) = \
            HEADER_STRUCT.unpack_from(data)
        if job != self.job:
            return
        self.nic.heard(self.now)
        if ptype == PacketType.GENERATION:
            mismatch = width_mismatch(count, self.wire, self.nic.switch_ip)
            if mismatch:
                raise TransportError(f"{self.who()}: {mismatch}")
            if self.phase is Phase.GENERATION:
                self._start((generation + 1) % GENERATIONS)
            elif newer_generation(generation, self.generation):
                if self.slots.answers:
                    raise TransportError(
                        f"{self.who()}: switch {self.nic.switch_ip} has the job at generation "
                        f"{generation}, newer than this call's {self.generation}: another run "
                        "of this job started there, so this call is abandoned")
                # A co-worker started with a newer generation: take it over, prime again.
                self.generation = generation
                self.slots.restart(self.now)
            return
        slots = self.slots
        if (self.phase is not Phase.STEPS or generation != self.generation
                or not slots.expects(version, slot, offset)):
            return
        if ptype == PacketType.PENDING:
            slots.on_pending(self.now, slot)
            return
        if ptype == PacketType.MISSING:
            slots.on_missing(self.now, slot)
            return
        if ptype not in RESULT_TYPES or len(data) < self.wire.payload_bytes:
            return
        chunk = slots.chunk(slot)
        if chunk >= 0:
            self.sums[chunk] = np.frombuffer(data, dtype=LANE_DTYPE, count=self.wire.lanes,
                                             offset=HEADER_BYTES)
            self.max_exponents[chunk] = slots.next_exponent[slot]
            self.done_chunks += 1
            if self.progress is not None and self.done_chunks % 1024 == 0:
                self.progress(self.done_chunks, self.chunks)
        elif chunk == -1:
            self.primed += 1
            if slot == 0:
                self._check_length(data)
        slots.next_exponent[slot] = exponent
        slots.answered(self.now, slot)
        if not slots.finished(slot):
            slots.launch(slot, self.now)
        if slots.done:
            self._complete()

    def _on_timer(self) -> None:
        now = self.now
        if now >= self._deadline():
            self._fail()
        if now < self.next_scan:
            return
        if self.phase is Phase.GENERATION:
            self._ask_generation()
            return
        if switch_down(self.nic, now, lambda: self.send_frame(
                0, generation_question(self.job, self.worker, self.wire))):
            raise TransportError(
                f"{self.who()}: switch {self.nic.switch_ip} stopped answering: nothing from it "
                f"for {now - self.nic.last_heard:.1f} s, not even to a question whether it "
                f"is alive ({self.slots.waiting()} slot(s) waiting): it is down or cut off")
        resend_overdue(self.nic, [self.slots], now)
        self.next_scan = now + scan_interval([self.nic])

    def _check_length(self, data: bytes | bytearray | memoryview) -> None:
        lanes = struct.unpack_from("!8i", data, HEADER_BYTES)
        own = length_lanes(self.length)
        n, length = self.workers, self.length
        workers = lanes[0] // length
        if workers != n and all(total == workers * mine
                                for total, mine in zip(lanes, own, strict=True)):
            raise TransportError(
                f"job {self.job}: --world {n}, but the switch sums the contributions of "
                f"{workers} workers for this job (each with {length} elements): give every "
                f"worker --world {workers}; nothing was summed")
        if any(total != n * mine for total, mine in zip(lanes, own, strict=True)):
            raise LengthMismatch(
                f"job {self.job}: gradient lengths differ across the {n} workers (this "
                f"worker has {length} elements; the lengths sum to {lanes[0]}, not "
                f"{n} x {length} = {n * length}); nothing was summed")

    def _complete(self) -> None:
        self.phase = Phase.COMPLETE
        if self.progress is not None:
            self.progress(self.chunks, self.chunks)
        self.stats.seconds = self.now - self.started
        self.result = dequantize_flat(self.sums, self.max_exponents, self.workers,
                                      self.length, out=self.out)

    def _fail(self) -> None:
        waited = self.now - self.started
        if self.phase is Phase.GENERATION:
            raise TransportError(
                f"{self.who()}: switch {self.nic.switch_ip} did not answer within "
                f"{self.start_timeout:g} s: is the switch up, and is job {self.job} set up on "
                f"it with worker {self.worker} on this port (bml-ctl job-add)?")
        if self.primed < self.window:
            raise TransportError(
                f"{self.who()}: no complete answer from switch {self.nic.switch_ip} within "
                f"{waited:.1f} s ({self.primed} of {self.window} slots primed, "
                f"{self.stats.retransmissions} retransmissions). Is job {self.job} set up on "
                f"the switch (bml-ctl job-add) for {self.workers} workers, and are all of them "
                "running?")
        raise TransportError(
            f"{self.who()}: {self.chunks - self.done_chunks} of {self.chunks} chunks still "
            f"unanswered after {waited:.1f} s (max {max(self.slots.retries)} retries on one "
            f"slot, {self.stats.retransmissions} retransmissions): a worker or the switch "
            "stopped")
