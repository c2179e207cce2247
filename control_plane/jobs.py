"""Jobs: a job over a set of servers becomes aggregation groups, one per switch it uses.

A group is what one switch needs to know: the job id, which worker id sits on which port
(the expected contributions per slot are all of them), where results go, and the slice of the
switch's slot pool that the job may use. Pools of different jobs never overlap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from bml.protocol import DEFAULT_LANES, MAX_JOB_ID, MAX_WORKERS, POOL_SLOTS, ResultMode
from bml.schedule import (
    AUTO,
    DEFAULT_WINDOW,
    MAX_SCHEDULED_JOB,
    SCHEDULES,
    ScheduleError,
    make_schedule,
    stripe_job_id,
    switch_modes,
)
from bml.topology import Topology, TopologyError

DEFAULT_POOL_SIZE = 512


class JobError(ValueError):
    pass


@dataclass(frozen=True)
class AggregationGroup:
    switch: str
    job_id: int
    members: dict[int, int]  # worker id -> switch port
    result_mode: int = ResultMode.MULTICAST
    pool_base: int = 0
    pool_size: int = DEFAULT_POOL_SIZE

    @property
    def mcast_group(self) -> int:
        return self.job_id

    def to_json(self) -> dict:
        data = asdict(self)
        data["members"] = {str(k): v for k, v in self.members.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> AggregationGroup:
        data = dict(data)
        data["members"] = {int(k): v for k, v in data["members"].items()}
        return cls(**data)


@dataclass
class JobPlan:
    job_id: int
    servers: tuple[int, ...]
    level: int  # the one aggregating level of a single-level job; -1 for a scheduled job
    groups: list[AggregationGroup] = field(default_factory=list)
    schedule: str | None = None  # a scheduled job's default schedule (auto or a name)
    elastic: bool = False  # its workers go on without one that leaves (a star's job)
    lanes: int = DEFAULT_LANES  # values per packet of its switches' pipeline (their P4Info)

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "servers": list(self.servers), "level": self.level,
                "groups": [g.to_json() for g in self.groups], "schedule": self.schedule,
                "elastic": self.elastic, "lanes": self.lanes}

    @classmethod
    def from_json(cls, data: dict) -> JobPlan:
        return cls(data["job_id"], tuple(data["servers"]), data["level"],
                   [AggregationGroup.from_json(g) for g in data["groups"]],
                   data.get("schedule"), bool(data.get("elastic", False)),
                   int(data.get("lanes", DEFAULT_LANES)))


def allocate_pool(size: int, taken: list[AggregationGroup]) -> int:
    """First fit of ``size`` slots into the switch pool around the groups already there."""
    if not 1 <= size <= POOL_SLOTS:
        raise JobError(f"pool size must be 1..{POOL_SLOTS} slots (got {size})")
    start = 0
    for group in sorted(taken, key=lambda g: g.pool_base):
        if group.pool_base - start >= size:
            return start
        start = max(start, group.pool_base + group.pool_size)
    if POOL_SLOTS - start >= size:
        return start
    raise JobError(f"no {size} free slots left in the switch's pool of {POOL_SLOTS}")


def plan_job(topology: Topology, job_id: int, servers: list[int], level: int = 0,
             pool_size: int = DEFAULT_POOL_SIZE,
             existing: list[AggregationGroup] | None = None,
             result_mode: int = ResultMode.MULTICAST) -> JobPlan:
    """Aggregate across ``servers`` on their level-``level`` switches.

    On a star this is one group for the whole job, worker id = the server's rank in
    ``servers``. In a BCube each level-l switch gets a group of the job's servers attached to
    it, worker id = the server's digit l, so every switch of the level aggregates its own
    members in parallel.
    """
    existing = existing or []
    if not 1 <= job_id <= MAX_JOB_ID:
        raise JobError(f"job id must be 1..{MAX_JOB_ID} (got {job_id})")
    if not servers or len(set(servers)) != len(servers):
        raise JobError(f"a job needs distinct servers (got {servers})")
    bad = [s for s in servers if not 0 <= s < topology.num_servers]
    if bad:
        raise JobError(f"servers {bad} are not in {topology.spec} "
                       f"(0..{topology.num_servers - 1})")
    if not 0 <= level < topology.k:
        raise TopologyError(f"{topology.spec} has levels 0..{topology.k - 1}, not {level}")
    if any(g.job_id == job_id for g in existing):
        raise JobError(f"job {job_id} is already set up")
    plan = JobPlan(job_id, tuple(servers), level)
    by_switch: dict[str, dict[int, int]] = {}
    for rank, server in enumerate(servers):
        nic = topology.nics(server)[level]
        worker = rank if topology.k == 1 else topology.digits(server)[level]
        by_switch.setdefault(nic.switch, {})[worker] = nic.port
    for switch, members in sorted(by_switch.items()):
        if len(members) > MAX_WORKERS:
            raise JobError(f"switch {switch} would have {len(members)} workers; "
                           f"a slot's bitmap holds {MAX_WORKERS}")
        taken = [g for g in existing if g.switch == switch]
        base = allocate_pool(pool_size, taken)
        plan.groups.append(AggregationGroup(switch, job_id, members, result_mode, base,
                                            pool_size))
    return plan


def plan_scheduled_job(topology: Topology, job_id: int, schedule: str = AUTO,
                       pool_size: int = DEFAULT_WINDOW,
                       existing: list[AggregationGroup] | None = None,
                       elastic: bool = False) -> JobPlan:
    """A job over every server of the topology, run by a schedule on all NICs.

    Every switch gets one group per stripe (switch job id ``stripe_job_id(job, p)``): results
    to the chunk's owner where the stripe reduce-scatters on that level, to all where it
    allreduces (``bml.schedule.switch_modes``). Those entries serve the in-network and the
    mixed schedule alike and host-based needs none, so the schedule the workers run (the
    job's default, recorded here, or their own ``--schedule``) needs no other set-up."""
    existing = existing or []
    if not 1 <= job_id <= MAX_SCHEDULED_JOB:
        raise JobError(f"a scheduled job's id must be 1..{MAX_SCHEDULED_JOB} (got {job_id}): "
                       "each of its stripes takes a switch job id of its own")
    if schedule != AUTO and schedule not in SCHEDULES:
        raise JobError(f"unknown schedule {schedule!r}: auto, {', '.join(SCHEDULES)}")
    if schedule != AUTO:
        try:
            make_schedule(topology, schedule)
        except ScheduleError as exc:
            raise JobError(str(exc)) from None
    taken_ids = {g.job_id for g in existing}
    ids = {stripe_job_id(job_id, p) for p in range(topology.k)}
    if taken_ids & ids:
        raise JobError(f"job {job_id} is already set up (switch job ids {sorted(taken_ids & ids)}"
                       " are taken)")
    if topology.n > MAX_WORKERS:
        raise JobError(f"{topology.n} servers per switch; a slot's bitmap holds {MAX_WORKERS}")
    if elastic and topology.k != 1:
        raise JobError(f"an elastic job shrinks to its survivors on a star only ({topology.spec}"
                       " is a BCube)")
    plan = JobPlan(job_id, tuple(range(topology.num_servers)), -1, schedule=schedule,
                   elastic=elastic)
    modes = switch_modes(topology)
    planned: list[AggregationGroup] = []
    for sw in topology.switches:
        for p in range(topology.k):
            members = {topology.digits(server)[sw.level]: port
                       for server, port in zip(sw.servers, sw.ports, strict=True)}
            mode = (ResultMode.TO_OWNER if modes[(p, sw.level)] == "owner"
                    else ResultMode.MULTICAST)
            taken = [g for g in existing + planned if g.switch == sw.name]
            base = allocate_pool(pool_size, taken)
            group = AggregationGroup(sw.name, stripe_job_id(job_id, p), members, mode, base,
                                     pool_size)
            planned.append(group)
    plan.groups = planned
    return plan
