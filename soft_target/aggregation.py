"""The slot pool's registers and what a contribution does to them: the software target's twin
of ``p4src/aggregation.p4`` (whose registers ``control_plane/aggregation.py`` resets through
the data plane, with RESET frames). Same order of checks, same register semantics."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from bml.protocol import POOL_SLOTS, Wire, newer_generation
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
    from soft_target.pipeline import Tables

POOL_COPIES = 2 * POOL_SLOTS
JOB_IDS = 4096  # one generation register per job id
_BE_VALUES = np.dtype(">i4")
# ResultRouting.apply: what aggregation does not consume goes on to result routing (bml.p4).
Route = Callable[..., list[tuple[int, bytes]]]


class Aggregation:
    """The registers of one switch's slot pool. ``route`` is the next control (ResultRouting):
    called here, where the outcome is known, rather than returned to the pipeline, so that no
    object is built per packet to carry it."""

    def __init__(self, stats: list[int], drops: list[int], route: Route, wire: Wire) -> None:
        self.stats = stats
        self.drops = drops
        self.route = route
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
                values = self.sums[idx].astype(_BE_VALUES).tobytes()
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
        incoming = np.frombuffer(frame, dtype=_BE_VALUES, count=self.lanes, offset=VALUES_OFF)
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
                          row.astype(_BE_VALUES).tobytes())

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
