"""Which jobs exist and which worker sits on which port: the software target's twin of
``p4src/admission.p4`` (programmed by ``control_plane/admission.py``), with its checks in the
same order, so that a packet failing several is counted under the same drop reason. The
width is the pipeline's (``bml.protocol.Wire``): a contribution whose ``count`` is not its
blocks is a host of another width, told apart before any length check."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bml.protocol import CPU_PORT, Wire
from control_plane.p4info import Names
from soft_target.defines import (
    DROP_BAD_LENGTH,
    DROP_BAD_SLOT,
    DROP_BAD_TYPE,
    DROP_BAD_WIDTH,
    DROP_FORGED_CONTROL,
    DROP_FORGED_WORKER,
    DROP_SHORT_PACKET,
    DROP_UNKNOWN_JOB,
    DROP_WRONG_PORT,
    TYPE_BROADCAST,
    TYPE_DATA,
    TYPE_GENERATION,
    TYPE_PROBE,
    TYPE_RESET,
)
from soft_target.parser import (
    HEADER_END,
    IPV4_LEN_HEADER_ONLY,
    UDP_LEN_HEADER_ONLY,
    full_lengths,
)
from soft_target.tables import Row, SoftTable, named_params, port_by_key

_ACCEPTED_TYPES = (TYPE_DATA, TYPE_BROADCAST, TYPE_RESET, TYPE_GENERATION, TYPE_PROBE)
# Types whose count must be the pipeline's blocks (a PROBE copies a DATA header); a
# GENERATION question may carry any.
_CONTRIBUTIONS = (TYPE_DATA, TYPE_BROADCAST, TYPE_RESET, TYPE_PROBE)
_HEADER_ONLY = (TYPE_PROBE, TYPE_GENERATION)  # hdr.bml alone, nothing after it
_IPV4_LEN_HEADER_ONLY = IPV4_LEN_HEADER_ONLY.to_bytes(2, "big")
_UDP_LEN_HEADER_ONLY = UDP_LEN_HEADER_ONLY.to_bytes(2, "big")


@dataclass(frozen=True)
class JobConfig:
    """The parameters of ``set_job``, filled by the names the P4Info gives them (a renamed
    parameter fails the table write instead of landing in the wrong field)."""

    pool_base: int
    pool_size: int
    num_workers: int
    result_mode: int
    mcast_grp: int


@dataclass
class AdmissionTables:
    """Admission's part of ``pipeline.Tables``."""

    job_config: dict[int, JobConfig] = field(default_factory=dict)  # job_id -> set_job
    worker_admission: dict[tuple[int, int], int] = field(default_factory=dict)  # (job, worker)


def _compile_job_config(rows: list[Row]) -> dict[int, JobConfig]:
    return {key[0]: JobConfig(**named_params(action, params)) for key, action, params in rows}


TABLES = {
    Names.JOB_CONFIG: SoftTable("job_config", _compile_job_config),
    Names.WORKER_ADMISSION: SoftTable("worker_admission", port_by_key),
}


class Admission:
    """Counts its drops into BmlIngress's ``drops``, as admission.p4 sets meta.drop_reason."""

    def __init__(self, drops: list[int], wire: Wire) -> None:
        self.drops = drops
        self.blocks = wire.blocks  # LANE_BLOCKS
        self.full_end = wire.frame_bytes  # FRAME_BYTES
        ipv4_len, udp_len = full_lengths(wire)
        self.ipv4_len_full = ipv4_len.to_bytes(2, "big")
        self.udp_len_full = udp_len.to_bytes(2, "big")
        self.lengths_full = ipv4_len, udp_len

    def apply(self, tables: AdmissionTables, port: int, frame: bytes, from_controller: bool,
              ptype: int, version: int, job_id: int, worker_id: int, slot: int,
              count: int) -> JobConfig | None:
        """The job an aggregation packet belongs to, or None when it is dropped. The frame
        holds hdr.bml at least (the pipeline drops a shorter one as SHORT_PACKET before the
        header is unpacked); the fields are hdr.bml's."""
        drops = self.drops
        if count != self.blocks and ptype in _CONTRIBUTIONS:  # a host of another width
            drops[DROP_BAD_WIDTH] += 1
            return None
        if ptype in _HEADER_ONLY:  # the header alone, and lengths that say so
            bad_length = len(frame) != HEADER_END or frame[16:18] != _IPV4_LEN_HEADER_ONLY \
                or frame[38:40] != _UDP_LEN_HEADER_ONLY
        else:
            if len(frame) < self.full_end:  # the parser extracted no last block
                drops[DROP_SHORT_PACKET] += 1
                return None
            bad_length = len(frame) != self.full_end or frame[16:18] != self.ipv4_len_full \
                or frame[38:40] != self.udp_len_full
        if bad_length:
            drops[DROP_BAD_LENGTH] += 1
            return None
        if version > 1 or ptype not in _ACCEPTED_TYPES:
            drops[DROP_BAD_TYPE] += 1
            return None
        job = tables.job_config.get(job_id)
        if job is None:
            drops[DROP_UNKNOWN_JOB] += 1
            return None
        if slot >= job.pool_size:
            drops[DROP_BAD_SLOT] += 1
            return None
        if ptype == TYPE_RESET:
            if port != CPU_PORT or not from_controller:
                drops[DROP_FORGED_CONTROL] += 1
                return None
        else:
            worker_port = tables.worker_admission.get((job_id, worker_id))
            if worker_port is None:
                drops[DROP_FORGED_WORKER] += 1
                return None
            if worker_port != port:
                drops[DROP_WRONG_PORT] += 1
                return None
        return job

    def batch_contributions(self, tables: AdmissionTables, port: int, headers: np.ndarray,
                            lengths: np.ndarray, bml: np.ndarray
                            ) -> tuple[np.ndarray, int, JobConfig | None]:
        """Which frames of a batch from ``port`` (not the CPU port) ``apply`` admits as DATA
        contributions of one job, the first such frame's: (mask, job id, its config). Those
        pass every check above (none is counted); the caller sends the rest through
        ``apply`` one by one. ``headers`` are ``FrameBatch.headers``, ``bml`` their
        ``batch_is_bml``, ``lengths`` the frames' lengths."""
        ipv4_len, udp_len = self.lengths_full
        mask = (bml & (lengths == self.full_end) & (headers["type"] == TYPE_DATA)
                & (headers["version"] <= 1) & (headers["count"] == self.blocks)
                & (headers["ipv4_len"] == ipv4_len) & (headers["udp_len"] == udp_len))
        candidates = np.flatnonzero(mask)
        if not candidates.size:
            return mask, 0, None
        job_ids = headers["job_id"]
        job_id = int(job_ids[candidates[0]])
        job = tables.job_config.get(job_id)
        if job is None:
            return np.zeros_like(mask), job_id, None
        mask &= (job_ids == job_id) & (headers["slot"] < job.pool_size)
        workers = headers["worker_id"]
        admission = tables.worker_admission
        for worker in set(workers[mask].tolist()):
            if admission.get((job_id, worker)) != port:
                mask &= workers != worker
        return mask, job_id, job
