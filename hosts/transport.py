"""Reliable, windowed aggregation over plain UDP sockets: the hot path of the host agent.

A gradient of L float32 values is cut into C = ceil(L / 64) chunks; chunk c always uses slot
c mod W of the job's pool (W = the window), so up to W chunks are in flight. Each use of a slot
alternates its version bit (the switch's two copies). The exponent a chunk is quantised with
comes in-band: the packet for chunk c announces the worker's exponent of chunk c + W, the
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

Loss: a slot is re-sent one RTO (from RTT samples, Karn's rule) after its last send if a frame
sent after it has been answered since (RACK's rule); without that evidence only once nothing
at all has been answered for an RTO, doubling per retry of the slot (and for every slot after
any timer fired until a clean sample arrives): while answers keep coming, a late one is only
waiting its turn. A re-sent contribution is idempotent at the switch, which answers it with
the stored result once the slot is complete. Until the first answer only one slot is re-sent,
as a probe: the other workers may simply not have started yet. A re-send into a copy that
still waits for others is answered PENDING (counted; this path re-sends on its timers
regardless). Late or duplicate results are recognised by slot, version and offset and
ignored. Every wait is bounded: the priming round by ``start_timeout``, the whole call by
``timeout``.
"""

from __future__ import annotations

import select
import socket
import struct
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
    VALUES_BYTES,
    VALUES_PER_PACKET,
    PacketType,
    job_udp_port,
    newer_generation,
    pack_header,
)
from hosts.quantize import block_exponents, dequantize, quantize_to_wire
from hosts.sockets import force_buffers

PRIMING_OFFSET = 0xFFFFFFFF  # offset field of priming and flush uses
RTO_SAMPLES = 64  # answer times the timeout is estimated from
RTO_QUANTILE = 0.5  # the quantile of those that is an answer's time without loss
RTO_QUANTILES = 2.0  # the timeout, in that quantile
RTO_INITIAL = 0.05  # s, before any answer
_BE = np.dtype(">i4")
_ZERO_VALUES = bytes(VALUES_BYTES)
_ANSWER_TYPES = (PacketType.RESULT, PacketType.RESULT_RETX, PacketType.ACK,
                 PacketType.PENDING)
# Lanes of slot 0's priming packet: the length, and hashes of it (see _length_lanes).
_LENGTH_PRIMES = (1, 40503, 65537, 2654435761 % (1 << 20), 97, 7919, 104729, 15485863)


class TransportError(RuntimeError):
    """The call could not finish; the message says what is missing and what to check."""


class LengthMismatch(TransportError):
    pass


@dataclass
class Rto:
    """Retransmission timeout from answer-time samples (Karn's rule by the caller), doubled by
    ``timed_out`` until a clean sample comes back.

    An aggregation slot's answer waits for every worker's contribution, so its time includes
    the other workers' recoveries from their own losses: under loss the slow part of the
    samples is other workers' re-sends, not the network (at 10% loss each way, half of a
    4-worker slot's uses wait for one). TCP's mean + 4 deviations would follow that up (and
    every re-send would then wait longer, making the samples longer still, up to the cap).
    A low quantile of the recent samples is what an answer takes when nothing was lost;
    ``RTO_QUANTILES`` times it is the timeout."""

    floor: float = 0.01
    cap: float = 5.0
    backoff: int = 1
    samples: deque = field(default_factory=lambda: deque(maxlen=RTO_SAMPLES))
    base: float = RTO_INITIAL
    _fresh: int = 0

    @property
    def value(self) -> float:
        return min(self.cap, max(self.floor, self.base) * self.backoff)

    def sample(self, rtt: float) -> None:
        self.backoff = 1
        self.samples.append(rtt)
        self._fresh += 1
        if self._fresh >= 8 or len(self.samples) < 8:  # re-estimated every 8 samples
            self._fresh = 0
            ordered = sorted(self.samples)
            self.base = RTO_QUANTILES * ordered[int(RTO_QUANTILE * (len(ordered) - 1))]

    def timed_out(self) -> None:
        self.backoff = min(self.backoff * 2, 1 << 10)


@dataclass
class Stats:
    packets_sent: int = 0
    retransmissions: int = 0
    results: int = 0
    pending: int = 0  # re-sent slots the switch answered PENDING (contribution already in)
    duplicates_ignored: int = 0
    seconds: float = 0.0


def generation_question(job: int, worker: int) -> bytes:
    """A GENERATION question (a full-size frame, as admission requires) of ``worker``."""
    return pack_header(PacketType.GENERATION, job, worker, 0, count=0) + _ZERO_VALUES


def _length_lanes(length: int) -> list[int]:
    """Lane 0: the length; lanes 1-7: hashes of it, each < 2**20 so N of them sum safely.

    If the sums over the N workers equal N times a worker's own lanes, that worker's length
    is almost surely everyone's (one exact check, seven pseudo-random ones)."""
    return [length] + [(length * p) % (1 << 20) for p in _LENGTH_PRIMES[1:]]


class AggregationTransport:
    """One worker's connection to one switch for one job."""

    def __init__(self, job_id: int, worker_id: int, num_workers: int, local_ip: str,
                 switch_ip: str, window: int = 256, timeout: float = 60.0,
                 start_timeout: float = 10.0, min_rto: float = 0.01,
                 max_rto: float = 5.0, sock: socket.socket | None = None) -> None:
        self.job_id = job_id
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.switch = (switch_ip, BML_UDP_PORT)
        self.window = window
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.min_rto = min_rto
        self.max_rto = max_rto
        self.timer = Rto(min_rto, max_rto)
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            force_buffers(sock)
            try:
                sock.bind((local_ip, job_udp_port(job_id)))
            except OSError as exc:
                raise TransportError(f"cannot bind {local_ip}:{job_udp_port(job_id)} for job "
                                     f"{job_id}: {exc}") from None
        sock.setblocking(False)
        self.sock = sock
        self.generation: int | None = None  # the last call's, if it ended well

    def close(self) -> None:
        self.sock.close()

    @property
    def rto(self) -> float:
        return self.timer.value

    def _timed_out(self) -> None:
        """A timer fired: until a clean RTT sample comes back, wait twice as long (as TCP
        does). Without this, an estimate from a quieter time (a small earlier call, an idle
        link) keeps re-sending the whole window into the queue it is waiting behind."""
        self.timer.timed_out()

    def _sample(self, rtt: float) -> None:
        self.timer.sample(rtt)

    def ask_generation(self) -> int:
        """The job's generation at the switch: a GENERATION question, asked again until it is
        answered within ``start_timeout``."""
        question = generation_question(self.job_id, self.worker_id)
        buffer = bytearray(PAYLOAD_BYTES + 64)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self.sock.sendto(question, self.switch)
            asked = time.monotonic()
            while time.monotonic() - asked < 0.2:
                select.select([self.sock], [], [], 0.05)
                while True:
                    try:
                        size = self.sock.recv_into(buffer)
                    except BlockingIOError:
                        break
                    if size < HEADER_BYTES:
                        continue
                    ptype, _v, job, *_rest, generation, _o = HEADER_STRUCT.unpack_from(buffer)
                    if ptype == PacketType.GENERATION and job == self.job_id:
                        return generation
        raise TransportError(
            f"job {self.job_id} worker {self.worker_id}: switch {self.switch[0]} did not answer "
            f"within {self.start_timeout:g} s: is the switch up, and is job {self.job_id} set up "
            f"on it with worker {self.worker_id} on this port (bml-ctl job-add)?")

    def allreduce(self, values: np.ndarray,
                  progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, Stats]:
        """Sum of ``values`` (flat float32) over the job's workers, and this call's stats."""
        last, self.generation = self.generation, None
        if last is None:
            last = self.ask_generation()
        generation = (last + 1) % GENERATIONS
        result, stats, generation = self._allreduce(values, progress, generation)
        self.generation = generation
        return result, stats

    def _allreduce(self, values: np.ndarray, progress: Callable[[int, int], None] | None,
                   generation: int) -> tuple[np.ndarray, Stats, int]:
        flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
        length = flat.size
        chunks = max(1, -(-length // VALUES_PER_PACKET))
        blocks = np.zeros((chunks, VALUES_PER_PACKET), dtype=np.float32)
        blocks.reshape(-1)[:length] = flat
        own_exponents = block_exponents(blocks)
        blocks64 = blocks.astype(np.float64)
        window = min(self.window, chunks)
        n = self.num_workers
        sums = np.zeros((chunks, VALUES_PER_PACKET), dtype=np.int32)
        max_exponents = np.zeros(chunks, dtype=np.int64)
        stats = Stats()
        started = time.monotonic()

        # Per slot: uses so far this call, what is in flight (chunk index, -1 priming,
        # -2 flush), the frame and when it was first and last sent, and its retries.
        uses = [0] * window
        in_flight = [0] * window
        frames: list[bytes | None] = [None] * window
        first_sent = [0.0] * window
        last_sent = [0.0] * window
        retries = [0] * window
        pending = bytearray(window)  # answered PENDING: only the fallback re-sends
        total_uses = [1 + -(-(chunks - s) // window) for s in range(window)]
        total_uses = [u + (u & 1) for u in total_uses]
        next_exponent = [EXPONENT_NONE] * window  # max exponent for the slot's next chunk
        remaining = window
        done_chunks = 0
        answered_sent = 0.0  # the latest send time of a frame answered so far
        last_answer = time.monotonic()
        header = HEADER_STRUCT.pack
        sendto = self.sock.sendto
        switch = self.switch
        job, me = self.job_id, self.worker_id

        def announce(chunk: int) -> int:
            return int(own_exponents[chunk]) if chunk < chunks else EXPONENT_NONE

        def send(slot: int, frame: bytes, now: float) -> None:
            frames[slot] = frame
            first_sent[slot] = last_sent[slot] = now
            retries[slot] = 0
            pending[slot] = 0
            sendto(frame, switch)
            stats.packets_sent += 1

        def launch(slot: int, now: float) -> None:
            """Send the slot's next use: priming, a chunk, or a flush."""
            use = uses[slot]
            version = use & 1
            if use == 0:
                lanes = _ZERO_VALUES
                if slot == 0:
                    lanes = struct.pack(f"!{VALUES_PER_PACKET}i",
                                        *_length_lanes(length), *[0] * (VALUES_PER_PACKET - 8))
                in_flight[slot] = -1
                frame = header(PacketType.DATA, version, job, me, 0, slot, announce(slot), 0,
                               generation, PRIMING_OFFSET) + lanes
            else:
                chunk = slot + (use - 1) * window
                if chunk < chunks:
                    e_max = next_exponent[slot]
                    if own_exponents[chunk] > e_max:
                        raise TransportError(
                            f"job {job}: the switch announced max exponent {e_max} for chunk "
                            f"{chunk}, below this worker's {own_exponents[chunk]}: the job's "
                            "slots hold state from another run; reset the job "
                            "(bml-ctl job-remove / job-add)")
                    q = quantize_to_wire(blocks64[chunk], e_max, n)
                    in_flight[slot] = chunk
                    count = min(VALUES_PER_PACKET, length - chunk * VALUES_PER_PACKET)
                    frame = header(PacketType.DATA, version, job, me, 0, slot,
                                   announce(chunk + window), max(count, 0), generation,
                                   chunk * VALUES_PER_PACKET) + q
                else:
                    in_flight[slot] = -2
                    frame = header(PacketType.DATA, version, job, me, 0, slot, EXPONENT_NONE,
                                   0, generation, PRIMING_OFFSET) + _ZERO_VALUES
            send(slot, frame, now)

        now = time.monotonic()
        for slot in range(window):
            launch(slot, now)
        primed = 0
        buffer = bytearray(PAYLOAD_BYTES + 64)
        recv_into = self.sock.recv_into
        next_scan = now + self.rto
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        while remaining:
            now = time.monotonic()
            limit = self.start_timeout if primed < window else self.timeout
            if now - started > limit:
                self._fail(stats, started, primed, window, done_chunks, chunks, retries)
            poll.poll(max(0.0, min(next_scan - now, 0.01)) * 1000)
            while True:
                try:
                    size = recv_into(buffer)
                except BlockingIOError:
                    break
                if size < HEADER_BYTES:
                    continue
                (ptype, version, rjob, _w, _o, slot, exponent, _c, rgen, offset) = \
                    HEADER_STRUCT.unpack_from(buffer)
                if (ptype == PacketType.GENERATION and rjob == job
                        and newer_generation(rgen, generation)):
                    if stats.results:
                        raise TransportError(
                            f"job {job} worker {me}: switch {switch[0]} has the job at "
                            f"generation {rgen}, newer than this call's {generation}: another "
                            "run of this job started there, so this call is abandoned")
                    # A co-worker started with a newer generation: take it over, prime again.
                    generation = rgen
                    now = time.monotonic()
                    for slot in range(window):
                        launch(slot, now)
                    continue
                if (rjob != job or ptype not in _ANSWER_TYPES or rgen != generation
                        or slot >= window
                        or frames[slot] is None or version != uses[slot] & 1):
                    stats.duplicates_ignored += 1
                    continue
                chunk = in_flight[slot]
                expected_offset = chunk * VALUES_PER_PACKET if chunk >= 0 else PRIMING_OFFSET
                if offset != expected_offset:
                    stats.duplicates_ignored += 1
                    continue
                if ptype == PacketType.PENDING:
                    # The contribution is in; the copy waits for the others. Counted only:
                    # holding this path's re-sends back on it left a 5%-loss push with
                    # slots unanswered for 60 s once (not understood yet), so the one-NIC
                    # path keeps re-sending on its timers as before.
                    if not pending[slot]:
                        pending[slot] = 1
                        stats.pending += 1
                    continue
                if size < PAYLOAD_BYTES:
                    stats.duplicates_ignored += 1
                    continue
                now = time.monotonic()
                if retries[slot] == 0:  # unambiguous: the answer is to the one send (Karn)
                    self._sample(now - first_sent[slot])
                    if first_sent[slot] > answered_sent:
                        answered_sent = first_sent[slot]
                last_answer = now
                if stats.results == 0:
                    # The first answer: every other worker is up now. Timers that ran while
                    # they were starting restart, instead of all firing at once.
                    last_sent[:] = [now] * window
                stats.results += 1
                if chunk >= 0:
                    sums[chunk] = np.frombuffer(buffer, dtype=_BE, count=VALUES_PER_PACKET,
                                                offset=HEADER_BYTES)
                    max_exponents[chunk] = next_exponent[slot]
                    done_chunks += 1
                    if progress is not None and done_chunks % 1024 == 0:
                        progress(done_chunks, chunks)
                elif chunk == -1:
                    primed += 1
                    if slot == 0:
                        self._check_length(buffer, length)
                next_exponent[slot] = exponent
                uses[slot] += 1
                frames[slot] = None
                if uses[slot] < total_uses[slot]:
                    launch(slot, now)
                else:
                    remaining -= 1
            now = time.monotonic()
            if now >= next_scan:
                rto, max_rto = self.rto, self.max_rto
                fired = False
                # A slot is presumed lost after its timer if a frame sent after it has been
                # answered since (RACK's rule). Otherwise, while answers keep coming, its
                # answer is only waiting its turn (a queue filling up, a lagging co-worker);
                # once nothing has been answered for a timer (a tail of lost frames, a
                # co-worker's lost frame), the timer alone, backed off per retry.
                stalled = now - last_answer > rto
                # Until the first answer the other workers may still be starting: probe with
                # one slot rather than re-sending the whole window again and again.
                for slot in range(window if stats.results else 1):
                    frame = frames[slot]
                    if frame is None:
                        continue
                    if last_sent[slot] < answered_sent:
                        wait = min(max_rto, rto)
                    elif stalled or not stats.results:
                        wait = min(max_rto, rto * (1 << min(retries[slot], 8)))
                    else:
                        continue
                    if now - last_sent[slot] > wait:
                        sendto(frame, switch)
                        last_sent[slot] = now
                        retries[slot] += 1
                        stats.retransmissions += 1
                        stats.packets_sent += 1
                        fired = True
                if fired:
                    self._timed_out()
                next_scan = now + self.rto / 2
        if progress is not None:
            progress(chunks, chunks)
        stats.seconds = time.monotonic() - started
        result = dequantize(sums, max_exponents, n).reshape(-1)[:length]
        return result, stats, generation

    def _check_length(self, buffer: bytearray, length: int) -> None:
        lanes = struct.unpack_from("!8i", buffer, HEADER_BYTES)
        own = _length_lanes(length)
        n = self.num_workers
        workers = lanes[0] // length
        if workers != n and all(total == workers * mine
                                for total, mine in zip(lanes, own, strict=True)):
            raise TransportError(
                f"job {self.job_id}: --world {n}, but the switch sums the contributions of "
                f"{workers} workers for this job (each with {length} elements): give every "
                f"worker --world {workers}; nothing was summed")
        if any(total != n * mine for total, mine in zip(lanes, own, strict=True)):
            raise LengthMismatch(
                f"job {self.job_id}: gradient lengths differ across the {n} workers (this "
                f"worker has {length} elements; the lengths sum to {lanes[0]}, not "
                f"{n} x {length} = {n * length}); nothing was summed")

    def _fail(self, stats: Stats, started: float, primed: int, window: int, done: int,
              chunks: int, retries: list[int]) -> None:
        waited = time.monotonic() - started
        if primed < window:
            raise TransportError(
                f"job {self.job_id} worker {self.worker_id}: no complete answer from switch "
                f"{self.switch[0]} within {waited:.1f} s ({primed} of {window} slots primed, "
                f"{stats.retransmissions} retransmissions). Is job {self.job_id} set up on the "
                f"switch (bml-ctl job-add) for {self.num_workers} workers, and are all of them "
                "running?")
        raise TransportError(
            f"job {self.job_id} worker {self.worker_id}: {chunks - done} of {chunks} chunks "
            f"still unanswered after {waited:.1f} s (max {max(retries)} retries on one slot, "
            f"{stats.retransmissions} retransmissions): a worker or the switch stopped")
