"""The BML-INA pipeline in Python: the software target's twin of ``p4src/bml.p4``.

As in the P4 program, one module per control block holds that control's tables, registers
and logic (``parser``, ``forwarding``, ``admission``, ``aggregation``, ``result_routing``,
``egress_rewrite``, each named after its .p4 file); this one composes them in the order
BmlIngress and BmlEgress apply them and holds BmlIngress's counters. Each control keeps its
P4 counterpart's order of checks, so that the packet tests that run against
simple_switch_grpc hold this implementation to the same bytes. Where the two could differ,
the P4 program is the reference.

Table contents are plain dicts in one ``Tables`` snapshot that the P4Runtime server
(``soft_target.p4runtime_server``) replaces whole on every write: the packet loop never sees
a half-written table, and one packet sees the same tables from admission to egress.

A pipeline has one lane width, as a P4 build does (``Pipeline(lanes=...)``, one of
``bml.protocol.BUILT_LANES``; the P4Runtime server sets the width of the build it is given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bml.protocol import (
    CONTROLLER_MAGIC,
    CPU_PORT,
    DEFAULT_LANES,
    DROPS_SIZE,
    STATS_SIZE,
    wire,
)
from soft_target import admission, egress_rewrite, forwarding, result_routing
from soft_target.admission import Admission, AdmissionTables, JobConfig
from soft_target.aggregation import JOB_IDS, POOL_COPIES, Aggregation
from soft_target.batch import Copies, FrameBatch
from soft_target.defines import (
    DROP_FORGED_CONTROL,
    DROP_SHORT_PACKET,
    STAT_BROADCAST,
    TYPE_BROADCAST,
)
from soft_target.egress_rewrite import EgressRewrite, EgressRewriteTables, HostAddress
from soft_target.forwarding import Forwarding, ForwardingTables
from soft_target.parser import (
    BML_OFF,
    ETH,
    HEADER_END,
    IP,
    IPV4_LEN_HEADER_ONLY,
    UDP,
    UDP_LEN_HEADER_ONLY,
    VALUES_OFF,
    batch_is_bml,
    full_lengths,
    ipv4_checksum,
    is_bml,
    unpack_bml,
)
from soft_target.result_routing import ResultRouting, ResultRoutingTables
from soft_target.tables import SoftTable

__all__ = [
    "BML_OFF", "ETH", "HEADER_END", "IP", "IPV4_LEN_HEADER_ONLY", "JOB_IDS", "POOL_COPIES",
    "TABLES", "UDP", "UDP_LEN_HEADER_ONLY", "VALUES_OFF", "HostAddress", "JobConfig",
    "Pipeline", "Tables", "full_lengths", "ipv4_checksum",
]

BATCH_LEAST = 4  # frames below which a batch goes through ``process`` frame by frame

# Every P4 table the software target serves, by P4 name: each control module declares its own.
TABLES: dict[str, SoftTable] = {
    **forwarding.TABLES, **admission.TABLES, **result_routing.TABLES, **egress_rewrite.TABLES,
}


@dataclass
class Tables(EgressRewriteTables, ResultRoutingTables, AdmissionTables, ForwardingTables):
    """Everything the control plane installs, each control's part declared in its module;
    each attribute is replaced (``dataclasses.replace`` on the whole), never mutated."""


def _register(name: str) -> property:
    """Aggregation's register array ``name``, also reachable on the pipeline, where the
    simulator's and the tests' comparisons of two switches read it."""
    return property(lambda self: getattr(self.aggregation, name),
                    lambda self, value: setattr(self.aggregation, name, value),
                    doc=f"Aggregation's ``{name}`` register array.")


class Pipeline:
    """Registers, counters and tables of one switch, and the per-packet logic.

    The controls are wired to each other here, once: aggregation hands what it does not
    consume to result routing, result routing its copies to egress rewrite.
    """

    worker_bitmap = _register("worker_bitmap")
    contributions = _register("contributions")
    max_exponent = _register("max_exponent")
    chunk_offset = _register("chunk_offset")
    copy_generation = _register("copy_generation")
    job_generation = _register("job_generation")
    sums = _register("sums")

    def __init__(self, lanes: int = DEFAULT_LANES) -> None:
        self.wire = wire(lanes)  # raises WidthError for a width no packet has
        self.lanes = lanes
        self.full_end = self.wire.frame_bytes
        self.tables = Tables()
        self.stats = [0] * STATS_SIZE  # BmlIngress's counters, which the controls count into
        self.drops = [0] * DROPS_SIZE
        self.forwarding = Forwarding(self.stats, self.drops)
        self.admission = Admission(self.drops, self.wire)
        self.egress_rewrite = EgressRewrite(self.wire)
        self.result_routing = ResultRouting(self.drops, self.egress_rewrite.apply,
                                            self.egress_rewrite.apply_results)
        self.aggregation = Aggregation(self.stats, self.drops, self.result_routing.apply,
                                       self.result_routing.apply_results, self.wire)
        self.batched = 0  # frames process_batch aggregated as numpy (the rest: process)
        self.unaddressed = self.egress_rewrite.unaddressed
        self._forward = self.forwarding.apply
        self._admit = self.admission.apply
        self._aggregate = self.aggregation.apply
        self._route = self.result_routing.apply

    def reset_registers(self) -> None:
        """Power-on state: what a freshly started switch holds."""
        self.aggregation.reset_registers()

    def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """One packet in, the copies it leaves as (egress port, frame): BmlIngress, then
        BmlEgress for every copy."""
        if port == CPU_PORT:
            # The parser takes packet_out off a frame from the CPU port; ingress checks it.
            if len(frame) >= 2 and int.from_bytes(frame[:2], "big") != CONTROLLER_MAGIC:
                self.drops[DROP_FORGED_CONTROL] += 1
                return []
            from_controller = len(frame) >= 2
            frame = frame[2:]
        else:
            from_controller = False
        tables = self.tables
        if not is_bml(frame):
            return self._forward(tables, frame)
        # The parser extracted no whole bml: admission's short-packet check, made here
        # because hdr.bml cannot be unpacked before it (admission makes the others).
        if len(frame) < HEADER_END:
            self.drops[DROP_SHORT_PACKET] += 1
            return []
        (ptype, version, job_id, worker_id, _owner, slot, exponent, count, generation,
         offset) = unpack_bml(frame, BML_OFF)
        job = self._admit(tables, port, frame, from_controller, ptype, version, job_id,
                          worker_id, slot, count)
        if job is None:
            return []
        if ptype == TYPE_BROADCAST:
            self.stats[STAT_BROADCAST] += 1
            return self._route(tables, frame, port, job, ptype, exponent,
                               frame[VALUES_OFF:self.full_end])
        return self._aggregate(tables, frame, port, job, job_id, ptype, version, worker_id,
                               slot, exponent, generation, offset)

    def process_batch(self, port: int, frames: FrameBatch | Sequence[bytes]) -> Copies:
        """``process`` of each of ``frames`` from ``port`` in turn, the copies in the same
        order, with the same registers and counters after (tests/test_batch_pipeline.py).

        What a port mostly brings, runs of one job's contributions to different slots, is
        admitted and aggregated as numpy over the run (``Admission.batch_contributions``,
        ``Aggregation.apply_run``, ``EgressRewrite.apply_results``), read where the frames
        lie and its results' copies left in one array: per frame, a few list reads and writes
        instead of a pass through every control. Every other frame, and each frame of a run
        the registers make dependent, goes through ``process`` where it lies, so nothing is
        reordered that could change what happens."""
        batch = frames if isinstance(frames, FrameBatch) else FrameBatch.of(frames)
        count = len(batch)
        out = Copies()
        process = self.process
        if port == CPU_PORT or count < BATCH_LEAST:
            for i in range(count):
                out.extend(process(port, batch.frame(i)))
            return out
        tables = self.tables
        headers = batch.headers()
        fast, job_id, job = self.admission.batch_contributions(
            tables, port, headers, batch.lengths, batch_is_bml(headers))
        if job is None:
            for i in range(count):
                out.extend(process(port, batch.frame(i)))
            return out
        raw = headers.view(np.uint8).reshape(count, HEADER_END)
        start = 0
        fast_list = fast.tolist()
        while start < count:
            if not fast_list[start]:
                out.extend(process(port, batch.frame(start)))
                start += 1
                continue
            end = start + 1
            while end < count and fast_list[end]:
                end += 1
            taken, outcome, results = self.aggregation.apply_run(
                tables, batch, start, end, headers[start:end], raw[start:end], port, job,
                job_id)
            if outcome is None:  # every one aggregated: their copies in order
                self.batched += taken
                if type(results) is list:
                    out.extend(results)
                elif results is not None:
                    out.add_results(results, 0, len(results.frames))
            else:
                for i, copies in enumerate(outcome, start):
                    if copies is None:
                        out.extend(process(port, batch.frame(i)))
                        continue
                    self.batched += 1
                    if type(copies) is int:
                        out.add_results(results, copies, copies + 1)
                    elif copies:
                        out.extend(copies)
            start += taken
            if start < end:  # the frame the run could not take with the others
                out.extend(process(port, batch.frame(start)))
                start += 1
        return out
