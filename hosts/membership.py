"""Who takes part in a worker's calls and how: the job, its servers, the schedule.

It changes only between calls: a failed switch or link re-plans the schedule around its group
(``replanned``), and an elastic job on a star goes on without a worker that left (``shrunk``).
Every worker makes the same change from the same ABORT, so they stay in agreement. No I/O:
the real engine (``hosts/engine.py``) and the simulator (``simulation/``) both use it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bml.schedule import (
    HOST_BASED,
    Group,
    Op,
    Schedule,
    ScheduleError,
    make_schedule,
    stripe_job_id,
)
from bml.topology import Topology
from hosts.errors import TransportError


class PartFailed(TransportError):
    """A switch, or this server's link to it, stopped: the call can be re-planned around the
    ``broken`` groups (``Schedule.degraded``). ``rerun``: a neighbour's ABORT said it runs the
    call again, so this worker must too (it cannot go on in the call alone)."""

    def __init__(self, message: str, broken: set[Group], rerun: bool = False) -> None:
        super().__init__(message)
        self.broken = set(broken)
        self.rerun = rerun


class WorkerLost(TransportError):
    """A neighbour left mid-call (its connection closed): an elastic job goes on without the
    ``lost`` servers; any other fails the call naming them."""

    def __init__(self, message: str, lost: set[int], rerun: bool = False) -> None:
        super().__init__(message)
        self.lost = set(lost)
        self.rerun = rerun


PeerKey = tuple[int, int]  # (dimension, server in the job's topology): one mesh connection


@dataclass(frozen=True)
class Membership:
    """``topology`` is the job's topology now (after a shrink, a star of the survivors) and
    ``server`` this worker's number in it; ``members`` maps those numbers to servers of
    ``whole``, the topology the job was set up on."""

    job: int
    whole: Topology
    members: tuple[int, ...]
    topology: Topology
    server: int
    schedule: Schedule
    elastic: bool = False

    @classmethod
    def of(cls, job: int, server: int, topology: Topology, schedule: Schedule,
           elastic: bool = False) -> Membership:
        return cls(job, topology, tuple(range(topology.num_servers)), topology, server,
                   schedule, elastic)

    @property
    def home(self) -> int:
        """This worker's server number in the job's topology as set up."""
        return self.members[self.server]

    def home_of(self, server: int) -> int:
        return self.members[server]

    @property
    def base_code(self) -> str:
        """``plan_code`` without the broken groups, which the workers merge instead."""
        code = replace(self.schedule, broken=frozenset()).code
        if len(self.members) == self.whole.num_servers:
            return code
        return f"{code}:servers={','.join(map(str, self.members))}"

    def adopting(self, broken: set[Group]) -> Membership:
        """This membership with groups others found broken that this worker is not in (its
        own steps and connections stay as they are)."""
        return replace(self, schedule=replace(self.schedule,
                                              broken=self.schedule.broken | frozenset(broken)))

    def neighbours(self, dim: int) -> list[PeerKey]:
        return [(dim, s) for s in self.topology.neighbours(self.server, dim)]

    def peers(self) -> list[PeerKey]:
        return [key for dim in range(self.topology.k) for key in self.neighbours(dim)]

    def detours(self) -> dict[int, int]:
        """Level -> the level whose NICs carry this worker's connections of that level (its
        group there is broken)."""
        return {level: self.topology.detour_level(level) for level in range(self.topology.k)
                if self.schedule.is_broken(self.server, level)}

    def switch_jobs(self) -> list[tuple[int, int]]:
        """(level, stripe) of every switch job the schedule aggregates in."""
        schedule = self.schedule
        return sorted({(s.dim, p) for p in range(len(schedule.stripes))
                       for s in schedule.steps_of(p, self.server)
                       if s.op is not Op.AG and s.switch_share > 0})

    def probe_job(self) -> int:
        """The switch job a liveness question is asked for: every switch of a scheduled job
        has its stripe 0's group."""
        return stripe_job_id(self.job, 0)

    def live_levels(self) -> list[int]:
        """This worker's levels whose switch the schedule still counts on."""
        return [level for level in range(self.topology.k)
                if not self.schedule.is_broken(self.server, level)]

    def replanned(self, failure: PartFailed) -> Membership:
        """Go on without the failed groups: a degraded schedule (connections over detours)."""
        if failure.broken <= self.schedule.broken:  # already planned around: no way on
            raise TransportError(f"{failure}; it was already re-planned around")
        try:
            schedule = self.schedule.degraded(failure.broken)
        except ScheduleError as exc:
            raise TransportError(f"{failure}; no re-planning around it: {exc}") from None
        return replace(self, schedule=schedule)

    def around(self, levels: set[int], why: str) -> tuple[Membership, str] | None:
        """Re-planned around this worker's switches of ``levels`` (of those it still counts
        on), with the cause naming them ("switch(es) ... ``why``"); None if there are none.
        TransportError if there is no plan around them."""
        groups = {(level, self.topology.switch_index(self.server, level))
                  for level in levels & set(self.live_levels())}
        if not groups:
            return None
        names = ", ".join(self.topology.switch_at(*group).name for group in sorted(groups))
        cause = f"job {self.job} server {self.home}: switch(es) {names} {why}"
        return self.replanned(PartFailed(cause, groups)), cause

    def after(self, failure: PartFailed | WorkerLost | None) -> Membership:
        """The membership for the next call after a call that had its sum but saw
        ``failure``: re-planned around a part it did not know; else as it is (a part that
        cannot be planned around is the next call's to name)."""
        if not isinstance(failure, PartFailed) or failure.broken <= self.schedule.broken:
            return self
        try:
            return self.replanned(failure)
        except TransportError:
            return self

    def shrunk(self, loss: WorkerLost) -> Membership:
        """Go on with the survivors: a star of them, host-based (the switch's job still counts
        the whole membership, and only the control plane could change that)."""
        if not self.elastic:
            raise TransportError(str(loss))
        if self.whole.k != 1:
            raise TransportError(f"{loss}; an elastic job shrinks on a star only "
                                 f"({self.whole.spec} is a BCube)")
        members = tuple(m for m in self.members if m not in loss.lost)
        if len(members) == len(self.members):  # nobody new left: no way on
            raise TransportError(f"{loss}; it was already left out")
        if len(members) < 2 or self.home not in members:
            raise TransportError(f"{loss}; fewer than two workers are left")
        topology = Topology(len(members), 1, "star")
        return replace(self, members=members, topology=topology,
                       server=members.index(self.home),
                       schedule=make_schedule(topology, HOST_BASED))

    def addresses(self) -> list[tuple[str, ...]]:
        """Per server of ``topology``, its NICs' addresses."""
        return [tuple(nic.ip for nic in self.whole.nics(m)) for m in self.members]
