"""Ordinary traffic by destination MAC: the software target's twin of ``p4src/forwarding.p4``
(programmed by ``control_plane/forwarding.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from control_plane.p4info import Names
from soft_target.defines import DROP_NO_ROUTE, STAT_FORWARDED
from soft_target.parser import ETH
from soft_target.tables import Params, Row, SoftTable, named_params

_MAC_BYTES = 6


@dataclass
class ForwardingTables:
    """Forwarding's part of ``pipeline.Tables``. ``l2_default`` is l2_forward's default entry:
    forward_to(port), or None for the program's no_route."""

    l2_forward: dict[bytes, int] = field(default_factory=dict)  # dstAddr -> port
    l2_default: int | None = None


def _compile_l2_forward(rows: list[Row]) -> dict[bytes, int]:
    return {key[0].to_bytes(_MAC_BYTES, "big"): named_params(action, params)["port"]
            for key, action, params in rows}


def _compile_l2_default(action: str, params: Params) -> int | None:
    return named_params(action, params)["port"] if action == Names.FORWARD_TO else None


TABLES = {
    Names.L2_FORWARD: SoftTable("l2_forward", _compile_l2_forward,
                                "l2_default", _compile_l2_default),
}


class Forwarding:
    """Counts into BmlIngress's ``stats`` and ``drops``, as forwarding.p4's actions set
    meta.stat and meta.drop_reason for ingress to count."""

    def __init__(self, stats: list[int], drops: list[int]) -> None:
        self.stats = stats
        self.drops = drops

    def apply(self, tables: ForwardingTables, frame: bytes) -> list[tuple[int, bytes]]:
        """The frame leaves byte for byte as it came (the checksum unit rewrites only the
        packets the switch makes)."""
        if len(frame) < ETH:
            self.drops[DROP_NO_ROUTE] += 1
            return []
        egress = tables.l2_forward.get(frame[0:_MAC_BYTES], tables.l2_default)
        if egress is None:
            self.drops[DROP_NO_ROUTE] += 1
            return []
        self.stats[STAT_FORWARDED] += 1
        return [(egress, frame)]
