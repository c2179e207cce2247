"""The slot pool's registers and what a contribution does to them: the software target's twin
of ``p4src/aggregation.p4`` (whose registers ``control_plane/aggregation.py`` resets through
the data plane, with RESET frames). Same order of checks, same register semantics."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from bml.protocol import LANE_DTYPE, POOL_SLOTS, Wire, newer_generation
from soft_target.defines import (
    DROP_STALE,
    STAT_AGGREGATED,
    STAT_COMPLETED,
    STAT_DUPLICATE,
    STAT_GENERATION,
    STAT_MISSING,
    STAT_OLD_CALL,
    STAT_PENDING,
    STAT_RESET,
    STAT_RETX_ANSWERED,
    TYPE_DATA,
    TYPE_GENERATION,
    TYPE_MISSING,
    TYPE_PENDING,
    TYPE_PROBE,
    TYPE_RESET,
    TYPE_RESULT,
    TYPE_RESULT_RETX,
    probe_answers_sum,
)
from soft_target.parser import VALUES_OFF

if TYPE_CHECKING:
    from soft_target.admission import JobConfig
    from soft_target.batch import FrameBatch, ResultBlock
    from soft_target.pipeline import Tables

POOL_COPIES = 2 * POOL_SLOTS
JOB_IDS = 4096  # one generation register per job id
# ResultRouting.apply: what aggregation does not consume goes on to result routing (bml.p4).
Route = Callable[..., list[tuple[int, bytes]]]
# ResultRouting.apply_results: the RESULTs a run of contributions completed, all at once.
RouteResults = Callable[..., "ResultBlock | list[list[tuple[int, bytes]]]"]


# Aggregation.apply_run's answer: (frames taken, each one's outcome or None where all
# aggregated, the RESULT copies).
RunOutcome = tuple[int, "list | None", "ResultBlock | list[tuple[int, bytes]] | None"]


def _gatherer(indices: list[int]) -> Callable[[list[int]], tuple[int, ...]]:
    """A function reading a register list at ``indices``, one C call per list."""
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    if indices:
        only = indices[0]
        return lambda values: (values[only],)
    return lambda values: ()


class Aggregation:
    """The registers of one switch's slot pool. ``route`` is the next control (ResultRouting):
    called here, where the outcome is known, rather than returned to the pipeline, so that no
    object is built per packet to carry it."""

    def __init__(self, stats: list[int], drops: list[int], route: Route,
                 route_results: RouteResults, wire: Wire) -> None:
        self.stats = stats
        self.drops = drops
        self.route = route
        self.route_results = route_results
        self.lanes = wire.lanes
        self.blocks = wire.blocks  # LANE_BLOCKS: what a GENERATION answer's count says
        self.full_end = wire.frame_bytes
        self.probe_answers_sum = probe_answers_sum(wire)  # PROBE_ANSWERS_SUM
        self.reset_registers()

    def reset_registers(self) -> None:
        """Power-on state: what a freshly started switch holds."""
        self.worker_bitmap = [0] * POOL_COPIES
        self.contributions = [0] * POOL_COPIES
        self.max_exponent = [0] * POOL_COPIES
        self.chunk_offset = [0] * POOL_COPIES
        self.copy_generation = [0] * POOL_COPIES
        self.job_generation = [0] * JOB_IDS
        self.sums = np.zeros((POOL_COPIES, self.lanes), dtype=np.int32)

    def apply(self, tables: Tables, frame: bytes, port: int, job: JobConfig, job_id: int,
              ptype: int, version: int, worker_id: int, slot: int, exponent: int,
              generation: int, offset: int) -> list[tuple[int, bytes]]:
        """An admitted packet other than a BROADCAST; the copies it leaves."""
        copy0 = ((job.pool_base + slot) << 1) & 0xFFFFFFFF  # bit<32> arithmetic
        past = copy0 >= POOL_COPIES
        bitmaps = self.worker_bitmap
        stats = self.stats
        if ptype == TYPE_RESET:
            if not past:
                bitmaps[copy0] = bitmaps[copy0 | 1] = 0
                self.contributions[copy0] = self.contributions[copy0 | 1] = 0
            if job_id < JOB_IDS:
                self.job_generation[job_id] = 0  # a job set up afresh
            stats[STAT_RESET] += 1
            return []
        current = self.job_generation[job_id] if job_id < JOB_IDS else 0
        if ptype == TYPE_DATA and newer_generation(generation, current):
            current = generation  # a newer call: from now on the job's
            if job_id < JOB_IDS:
                self.job_generation[job_id] = current
        if ptype == TYPE_GENERATION or generation != current:
            # A query, or a contribution of an older call: answered with the job's generation
            # and this pipeline's blocks (a host of another width learns it at once).
            stats[STAT_GENERATION if ptype == TYPE_GENERATION else STAT_OLD_CALL] += 1
            return self.route(tables, frame, port, job, TYPE_GENERATION, exponent, b"",
                              generation=current, count=self.blocks)
        if past:
            return self._past_registers(tables, frame, port, job, ptype, exponent)
        idx = copy0 | version
        other = copy0 | (1 - version)
        me = (1 << worker_id) & 0xFFFFFFFF
        bitmap = bitmaps[idx]
        count = self.contributions[idx]
        stored_offset = self.chunk_offset[idx]
        if self.copy_generation[idx] != generation:
            bitmap = count = 0  # left by an older call: abandoned
        if bitmap & me:
            if count == job.num_workers and stored_offset == offset:
                if ptype == TYPE_PROBE and not self.probe_answers_sum:
                    # The sum would grow the header-only question by more than
                    # ANSWER_GROWTH_BYTES: MISSING, and the full frame re-sent gets the sum.
                    stats[STAT_MISSING] += 1
                    return self.route(tables, frame, port, job, TYPE_MISSING, exponent, b"",
                                      count=count)
                stats[STAT_RETX_ANSWERED] += 1
                values = self.sums[idx].astype(LANE_DTYPE).tobytes()
                return self.route(tables, frame, port, job, TYPE_RESULT_RETX,
                                  self.max_exponent[idx], values)
            if stored_offset == offset:
                # Still filling: the sender learns that its contribution is in (header only,
                # with the count so far).
                stats[STAT_PENDING] += 1
                return self.route(tables, frame, port, job, TYPE_PENDING, exponent, b"",
                                  count=count)
            stats[STAT_DUPLICATE] += 1
            return []
        if ptype == TYPE_PROBE:
            # Not in this copy: lost on its way, and the prober sends it again at once.
            stats[STAT_MISSING] += 1
            return self.route(tables, frame, port, job, TYPE_MISSING, exponent, b"",
                              count=count)
        if bitmap and stored_offset != offset:
            self.drops[DROP_STALE] += 1
            return []
        if count == job.num_workers and stored_offset == offset:
            # A late copy from a worker that moved on, even after every worker moved on.
            stats[STAT_DUPLICATE] += 1
            return []
        row = self.sums[idx]
        incoming = np.frombuffer(frame, dtype=LANE_DTYPE, count=self.lanes, offset=VALUES_OFF)
        if bitmap == 0:
            count = 0
            best = 0
            self.chunk_offset[idx] = offset
            self.copy_generation[idx] = generation
            row[:] = incoming
        else:
            best = self.max_exponent[idx]
            np.add(row, incoming, out=row, casting="unsafe")
        bitmaps[idx] = bitmap | me
        bitmaps[other] &= ~me & 0xFFFFFFFF
        count = (count + 1) & 0xFF
        self.contributions[idx] = count
        if exponent > best:
            best = exponent
        self.max_exponent[idx] = best
        stats[STAT_AGGREGATED] += 1
        if count != job.num_workers:
            return []
        stats[STAT_COMPLETED] += 1
        return self.route(tables, frame, port, job, TYPE_RESULT, best,
                          row.astype(LANE_DTYPE).tobytes())

    def apply_run(self, tables: Tables, batch: FrameBatch, start: int, end: int,
                  headers: np.ndarray, raw_headers: np.ndarray, port: int, job: JobConfig,
                  job_id: int) -> RunOutcome:
        """``apply`` of frames ``start..end-1`` of ``batch``, a run of admitted DATA
        contributions of one job (``headers``, ``raw_headers``: theirs of
        ``FrameBatch.headers`` and the same bytes as a (frames, HEADER_END) uint8 array), as
        numpy over the longest start of the run whose frames are independent of each other:
        each into a slot of its own, all of the job's current call (a newer call changes the
        job's generation for the frames after it). Returns (how many frames that start has,
        what each of them leaves, the RESULT copies). Where every one of them aggregated
        (what a port mostly brings), the second is None and the third is every copy they
        leave, in order: a block of the completed ones' (to a multicast group), a list (to
        the owners), or None. Otherwise the second has for each frame its copies (a list; []
        for one that completes nothing), the index of its copies in the block, or None for
        one the caller must send through ``apply`` (a re-send, a late or stale copy: every
        outcome but aggregating). The caller goes on after that start."""
        generation = headers["generation"].astype(np.int64)
        current = self.job_generation[job_id] if job_id < JOB_IDS else 0
        version = headers["version"].astype(np.int64)
        copy0 = ((job.pool_base + headers["slot"].astype(np.int64)) << 1) & 0xFFFFFFFF
        worker = headers["worker_id"].astype(np.int64)
        # Where the run stops being independent: the frame there goes through ``apply``.
        dependent = (generation != current) | (copy0 >= POOL_COPIES) | (worker >= 32)
        size = end - start
        stop = int(np.argmax(dependent)) if dependent.any() else size
        seen: set[int] = set()
        for at, pair in enumerate(copy0[:stop].tolist()):
            if pair in seen:
                stop = at
                break
            seen.add(pair)
        if stop < size:
            headers, raw_headers = headers[:stop], raw_headers[:stop]
            generation, version, copy0, worker = (generation[:stop], version[:stop],
                                                  copy0[:stop], worker[:stop])
        index = copy0 | version
        indices = index.tolist()
        bitmaps, contributions = self.worker_bitmap, self.contributions
        gather = _gatherer(indices)
        bitmap = np.array(gather(bitmaps), dtype=np.int64)
        count = np.array(gather(contributions), dtype=np.int64)
        stored_offset = np.array(gather(self.chunk_offset), dtype=np.int64)
        stale_call = np.array(gather(self.copy_generation), dtype=np.int64) != generation
        bitmap[stale_call] = 0
        count[stale_call] = 0
        me = np.left_shift(1, worker)
        offset = headers["offset"].astype(np.int64)
        same_chunk = stored_offset == offset
        workers = job.num_workers
        # apply's order: a re-send of this worker's, a stale copy, a late copy; else it adds.
        adds = ((bitmap & me) == 0) & ~((bitmap != 0) & ~same_chunk) \
            & ~((count == workers) & same_chunk)
        at = np.flatnonzero(adds)
        if not at.size:
            return stop, [None] * stop, None
        every = at.size == stop
        first = bitmap[at] == 0
        count = (np.where(first, 0, count[at]) + 1) & 0xFF
        exponents = np.array(gather(self.max_exponent), dtype=np.int64)
        best = np.maximum(np.where(first, 0, exponents if every else exponents[at]),
                          headers["exponent"][at])
        rows = index[at]
        sums, values, taken = self.sums, batch.rows[:, VALUES_OFF:self.full_end], start + at
        sums[rows[first]] = values[taken[first]].view(LANE_DTYPE)
        sums[rows[~first]] += values[taken[~first]].view(LANE_DTYPE)
        mine = me[at].tolist()
        chunk_offset, copy_generation, max_exponent = (self.chunk_offset, self.copy_generation,
                                                       self.max_exponent)
        for row, new_count, exponent, bit, other, is_first, chunk in zip(
                rows.tolist(), count.tolist(), best.tolist(), mine, (index[at] ^ 1).tolist(),
                first.tolist(), offset[at].tolist(), strict=True):
            if is_first:
                chunk_offset[row] = chunk
                copy_generation[row] = current
                bitmaps[row] = bit
            else:
                bitmaps[row] |= bit
            bitmaps[other] &= ~bit & 0xFFFFFFFF
            contributions[row] = new_count
            max_exponent[row] = exponent
        self.stats[STAT_AGGREGATED] += int(at.size)
        done = count == workers
        results = None
        if done.any():
            self.stats[STAT_COMPLETED] += int(done.sum())
            completed = at[done]
            results = self.route_results(tables, raw_headers[completed], port, job,
                                         best[done], sums[rows[done]])
        if every:
            if type(results) is list:
                results = [copy for copies in results for copy in copies]
            return stop, None, results
        outcome: list = [None] * stop
        for i in at.tolist():
            outcome[i] = []
        if type(results) is list:
            for i, leaving in zip(completed.tolist(), results, strict=True):
                outcome[i] = leaving
            return stop, outcome, None
        if results is not None:
            for trigger, i in enumerate(completed.tolist()):
                outcome[i] = trigger
        return stop, outcome, results

    def _past_registers(self, tables: Tables, frame: bytes, port: int, job: JobConfig,
                        ptype: int, exponent: int) -> list[tuple[int, bytes]]:
        """A pool that lies past the register arrays (only a control plane that does not check
        installs one; ours keeps pools inside POOL_SLOTS). BMv2 reads 0 there and ignores the
        writes, so every contribution is the first of an empty copy and nothing is kept: a
        RESET is counted (above), a contribution is aggregated alone and completes only a
        one-worker job, with its own values; a PROBE finds nothing there (MISSING)."""
        if ptype == TYPE_PROBE:
            self.stats[STAT_MISSING] += 1
            return self.route(tables, frame, port, job, TYPE_MISSING, exponent, b"", count=0)
        self.stats[STAT_AGGREGATED] += 1
        if job.num_workers != 1:
            return []
        self.stats[STAT_COMPLETED] += 1
        return self.route(tables, frame, port, job, TYPE_RESULT, exponent,
                          frame[VALUES_OFF:self.full_end])
