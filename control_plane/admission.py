"""Programs ``p4src/admission.p4``: which jobs exist and which worker sits on which port."""

from __future__ import annotations

from control_plane.jobs import AggregationGroup
from control_plane.p4info import Names
from control_plane.session import Entry, entry


def admission_entries(group: AggregationGroup) -> list[Entry]:
    job = entry(Names.JOB_CONFIG, {"hdr.bml.job_id": group.job_id}, Names.SET_JOB,
                pool_base=group.pool_base, pool_size=group.pool_size,
                num_workers=len(group.members), result_mode=group.result_mode,
                mcast_grp=group.mcast_group)
    workers = [
        entry(Names.WORKER_ADMISSION, {"hdr.bml.job_id": group.job_id,
                                       "hdr.bml.worker_id": worker}, Names.ADMIT, port=port)
        for worker, port in sorted(group.members.items())
    ]
    return [job, *workers]
