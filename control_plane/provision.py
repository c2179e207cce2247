"""Provisioning: a topology's switches get the pipeline and their entries; jobs come and go."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from bml.protocol import DEFAULT_LANES, Stat
from bml.topology import Switch, Topology
from control_plane.admission import admission_entries
from control_plane.aggregation import reset_frames
from control_plane.egress_rewrite import host_address_entries
from control_plane.forwarding import forwarding_entries
from control_plane.jobs import AggregationGroup
from control_plane.p4info import Names, built_p4info
from control_plane.result_routing import group_ports, owner_entries
from control_plane.session import SwitchSession, encode


def provision_switch(session: SwitchSession, topology: Topology, switch: Switch,
                     replace: bool = False) -> None:
    """Pipeline (not pushed again if it runs), forwarding and host addresses: everything that
    does not depend on jobs. ``replace``: entries the switch already holds are overwritten
    instead of refused (re-provisioning after an interrupted attempt)."""
    session.push_pipeline()
    session.write_entries(forwarding_entries(topology, switch), replace=replace)
    session.write_entries(host_address_entries(topology, switch), replace=replace)


def install_group(session: SwitchSession, switch: Switch, group: AggregationGroup,
                  timeout: float = 10.0, replace: bool = False) -> None:
    """Entries, multicast group, then a data-plane reset of the group's slots.

    The reset is confirmed through the RESET counter, so a job never starts on slots that
    still hold another job's partial sums. ``replace`` as in ``provision_switch``.
    """
    session.write_entries(admission_entries(group), replace=replace)
    session.write_entries(owner_entries(group), replace=replace)
    session.set_multicast_group(group.mcast_group, group_ports(group), replace=replace)
    reset_slots(session, switch, group, timeout)


def reset_slots(session: SwitchSession, switch: Switch, group: AggregationGroup,
                timeout: float = 10.0) -> None:
    before = session.read_counter(Names.STATS)[Stat.RESET]
    for frame in reset_frames(switch, group, session.wire):
        session.packet_out(frame)
    deadline = time.monotonic() + timeout
    while session.read_counter(Names.STATS)[Stat.RESET] - before < group.pool_size:
        if time.monotonic() > deadline:
            done = session.read_counter(Names.STATS)[Stat.RESET] - before
            raise TimeoutError(f"switch {session.name}: only {done} of {group.pool_size} slot "
                               f"resets for job {group.job_id} took effect within {timeout} s")
        time.sleep(0.02)


def remove_group(session: SwitchSession, switch: Switch, group: AggregationGroup,
                 missing_ok: bool = False) -> None:
    """Reset the slots through the data plane, then delete the job's entries.

    ``missing_ok``: entries already gone (an interrupted earlier removal) are no error; if
    the job's ``job_config`` entry is gone, no RESET can reach its slots any more (nor can a
    contribution), and the next job to use them resets them when it is installed."""
    if not missing_ok or has_job(session, group.job_id):
        reset_slots(session, switch, group)
    session.set_multicast_group(group.mcast_group, [], kind="DELETE", missing_ok=missing_ok)
    session.write_entries(owner_entries(group), kind="DELETE", missing_ok=missing_ok)
    session.write_entries(admission_entries(group)[::-1], kind="DELETE",
                          missing_ok=missing_ok)


def has_job(session: SwitchSession, job_id: int) -> bool:
    """Whether the switch holds a ``job_config`` entry for ``job_id``."""
    field_id, width = session.p4info.table(Names.JOB_CONFIG).match_fields["hdr.bml.job_id"]
    wanted = encode(job_id, width)
    return any(m.field_id == field_id and m.exact.value == wanted
               for e in session.read_table(Names.JOB_CONFIG) for m in e.match)


@contextmanager
def sessions(switches: dict[str, tuple[str, int]], election_id: tuple[int, int] = (0, 2),
             timeout: float = 5.0,
             lanes: int = DEFAULT_LANES) -> Iterator[dict[str, SwitchSession]]:
    """Sessions to several switches (name -> (address, device id)) running, or to be given,
    the ``lanes``-wide build; all closed on exit."""
    opened: dict[str, SwitchSession] = {}
    try:
        for name, (address, device_id) in switches.items():
            opened[name] = SwitchSession(name, address, device_id, election_id, timeout,
                                         p4info=built_p4info(lanes))
        yield opened
    finally:
        for session in opened.values():
            session.close()
