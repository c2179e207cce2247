"""Where a switch-made packet goes: the software target's twin of
``p4src/result_routing.p4`` (programmed by ``control_plane/result_routing.py``), with
v1model's packet replication engine, whose multicast groups only result routing uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bml.protocol import LANE_DTYPE
from control_plane.p4info import Names
from soft_target.batch import ResultBlock
from soft_target.defines import (
    DROP_NO_OWNER,
    MODE_TO_OWNER,
    TYPE_GENERATION,
    TYPE_MISSING,
    TYPE_PENDING,
    TYPE_RESULT,
    TYPE_RESULT_RETX,
)
from soft_target.parser import BML_OFF
from soft_target.tables import SoftTable, port_by_key

if TYPE_CHECKING:
    from soft_target.admission import JobConfig
    from soft_target.pipeline import Tables

_RESULTS = (TYPE_RESULT, TYPE_RESULT_RETX)
_TO_SENDER = (TYPE_RESULT_RETX, TYPE_GENERATION, TYPE_PENDING, TYPE_MISSING)
# EgressRewrite.apply, run for all of a packet's copies at once.
Egress = Callable[..., list[tuple[int, bytes]]]
# EgressRewrite.apply_results: the copies of many RESULTs to the same ports.
EgressResults = Callable[..., ResultBlock]


@dataclass
class ResultRoutingTables:
    """Result routing's part of ``pipeline.Tables``, with the replication engine's groups
    (written as P4Runtime multicast group entries, not table entries)."""

    owner_route: dict[tuple[int, int], int] = field(default_factory=dict)  # (job, owner) -> port
    mcast_groups: dict[int, tuple[int, ...]] = field(default_factory=dict)  # group -> ports


TABLES = {
    Names.OWNER_ROUTE: SoftTable("owner_route", port_by_key),
}


class ResultRouting:
    """``egress`` is the next stage (EgressRewrite), handed every egress port at once."""

    def __init__(self, drops: list[int], egress: Egress, egress_results: EgressResults
                 ) -> None:
        self.drops = drops
        self.egress = egress
        self.egress_results = egress_results

    def apply(self, tables: Tables, frame: bytes, port: int, job: JobConfig, ptype: int,
              exponent: int, values: bytes, generation: int | None = None,
              count: int | None = None) -> list[tuple[int, bytes]]:
        """A packet of type ``ptype`` (the one ingress made of ``frame``) with ``exponent``
        and ``values`` (empty: header only). A GENERATION answer (``generation`` in it), a
        PENDING or MISSING answer (the copy's ``count`` in it) go back to the sender, as does
        the answer to a retransmission or probe; the rest to the job's multicast group."""
        owner_port = None
        if ptype in _RESULTS and job.result_mode == MODE_TO_OWNER:
            owner_id = frame[BML_OFF + 5]
            owner_port = tables.owner_route.get((frame[BML_OFF + 2] << 8 | frame[BML_OFF + 3],
                                                 owner_id))
            if owner_port is None:
                self.drops[DROP_NO_OWNER] += 1
                return []
        if ptype in _TO_SENDER:
            egress_ports: tuple[int, ...] = (port,)
        else:
            egress_ports = tables.mcast_groups.get(job.mcast_grp, ())
        return self.egress(tables, frame, port, ptype, exponent, values, generation, count,
                           egress_ports, owner_port)

    def apply_results(self, tables: Tables, raw_headers: np.ndarray, port: int, job: JobConfig,
                      exponents: np.ndarray, sums: np.ndarray
                      ) -> ResultBlock | list[list[tuple[int, bytes]]]:
        """``apply`` of the RESULTs that a batch's frames completed (their first HEADER_END
        bytes as uint8 rows: all that ``apply`` reads of a trigger; each result's max exponent
        and int32 sums): to the job's multicast group, all at once (a block of every
        trigger's copies); to a chunk's owner, one by one (each trigger's copies)."""
        if job.result_mode == MODE_TO_OWNER:
            return [self.apply(tables, header.tobytes(), port, job, TYPE_RESULT, exponent,
                               row.astype(LANE_DTYPE).tobytes())
                    for header, exponent, row in zip(raw_headers, exponents.tolist(), sums,
                                                     strict=True)]
        return self.egress_results(tables, raw_headers, TYPE_RESULT, exponents, sums,
                                   tables.mcast_groups.get(job.mcast_grp, ()))
