"""Programs ``p4src/result_routing.p4``: the job's multicast group and its chunk owners."""

from __future__ import annotations

from control_plane.jobs import AggregationGroup
from control_plane.p4info import Names
from control_plane.session import Entry, entry


def owner_entries(group: AggregationGroup) -> list[Entry]:
    """Every member can own a chunk (reduce-scatter): owner id -> its port."""
    return [
        entry(Names.OWNER_ROUTE, {"hdr.bml.job_id": group.job_id, "hdr.bml.owner_id": worker},
              Names.ROUTE_TO_OWNER, port=port)
        for worker, port in sorted(group.members.items())
    ]


def group_ports(group: AggregationGroup) -> list[int]:
    return sorted(group.members.values())
