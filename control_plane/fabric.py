"""The fabric: a topology, the P4Runtime address of each of its switches, and the jobs on it.

It is kept in a JSON file (the emulation writes ``<run dir>/fabric.json``) so that every
``bml-ctl`` invocation, the health monitor and the emulation agree on what is installed.
Changes take an exclusive lock on the file.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bml.paths import DEFAULT_FABRIC
from bml.protocol import DEFAULT_LANES
from bml.schedule import DEFAULT_WINDOW
from bml.topology import Topology
from control_plane.jobs import JobError, JobPlan, plan_job, plan_scheduled_job
from control_plane.provision import install_group, provision_switch, remove_group, sessions

WRITER_ELECTION = (0, 2)


@dataclass
class Fabric:
    path: Path
    topology: str
    switches: dict[str, dict]  # name -> {"address": "127.0.0.1:port", "device_id": n}
    jobs: dict[str, dict] = field(default_factory=dict)  # str(job id) -> JobPlan JSON
    lanes: int = DEFAULT_LANES  # the P4 build its switches are given (values per packet)

    @classmethod
    def load(cls, path: Path = DEFAULT_FABRIC) -> Fabric:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no fabric at {path}: is an emulation up "
                                    "(bml-net up), or pass --fabric?")
        data = json.loads(path.read_text())
        return cls(path, data["topology"], data["switches"], data.get("jobs", {}),
                   int(data.get("lanes", DEFAULT_LANES)))

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"topology": self.topology, "switches": self.switches,
                                   "jobs": self.jobs, "lanes": self.lanes}, indent=1,
                                  sort_keys=True))
        tmp.replace(self.path)

    @property
    def topo(self) -> Topology:
        return Topology.parse(self.topology)

    @property
    def events_path(self) -> Path:
        return self.path.with_name("events.jsonl")

    def addresses(self, names: list[str] | None = None) -> dict[str, tuple[str, int]]:
        return {name: (sw["address"], sw["device_id"]) for name, sw in self.switches.items()
                if names is None or name in names}

    def plans(self) -> list[JobPlan]:
        return [JobPlan.from_json(data) for _, data in sorted(self.jobs.items(),
                                                                 key=lambda kv: int(kv[0]))]

    def provision(self) -> None:
        with sessions(self.addresses(), WRITER_ELECTION, lanes=self.lanes) as opened:
            for name, session in opened.items():
                provision_switch(session, self.topo, self.topo.switch(name))

    def add_job(self, job_id: int, servers: list[int], level: int = 0, pool_size: int = 512,
                result_mode: int = 0) -> JobPlan:
        """A single-level job: the servers' level-``level`` switches aggregate."""
        existing = [g for plan in self.plans() for g in plan.groups]
        return self._install(plan_job(self.topo, job_id, servers, level, pool_size, existing,
                                      result_mode))

    def add_scheduled_job(self, job_id: int, schedule: str = "auto",
                          pool_size: int = DEFAULT_WINDOW, elastic: bool = False) -> JobPlan:
        """A job over every server, run by a schedule on all NICs (``plan_scheduled_job``)."""
        existing = [g for plan in self.plans() for g in plan.groups]
        return self._install(plan_scheduled_job(self.topo, job_id, schedule, pool_size,
                                                existing, elastic))

    def job(self, job_id: int) -> JobPlan | None:
        data = self.jobs.get(str(job_id))
        return JobPlan.from_json(data) if data else None

    def _install(self, plan: JobPlan) -> JobPlan:
        if str(plan.job_id) in self.jobs:
            raise JobError(f"job {plan.job_id} is already set up")
        job_id = plan.job_id
        with sessions(self.addresses([g.switch for g in plan.groups]),
                      WRITER_ELECTION, lanes=self.lanes) as opened:
            widths = {name: session.running_lanes() for name, session in opened.items()}
            other = {name: lanes for name, lanes in widths.items() if lanes != self.lanes}
            if other:
                raise JobError(
                    f"job {job_id}: switch(es) {', '.join(sorted(other))} run "
                    f"{', '.join(str(lanes) if lanes else 'no' for lanes in other.values())}"
                    f"-lane pipeline(s), not the fabric's {self.lanes} lanes: provision them "
                    "again (bml-net up / bml-ctl provision)")
            plan.lanes = self.lanes
            for group in plan.groups:
                # replace: a job-add killed before it saved the fabric left entries behind
                install_group(opened[group.switch], self.topo.switch(group.switch), group,
                              replace=True)
        self.jobs[str(job_id)] = plan.to_json()
        self.save()
        return plan

    def remove_job(self, job_id: int) -> JobPlan:
        if str(job_id) not in self.jobs:
            raise JobError(f"job {job_id} is not set up (jobs: "
                           f"{', '.join(sorted(self.jobs, key=int)) or 'none'})")
        plan = JobPlan.from_json(self.jobs[str(job_id)])
        with sessions(self.addresses([g.switch for g in plan.groups]),
                      WRITER_ELECTION, lanes=self.lanes) as opened:
            for group in plan.groups:
                # missing_ok: a job-remove killed before it saved the fabric deleted some
                remove_group(opened[group.switch], self.topo.switch(group.switch), group,
                             missing_ok=True)
        del self.jobs[str(job_id)]
        self.save()
        return plan


@contextmanager
def locked(path: Path = DEFAULT_FABRIC) -> Iterator[Fabric]:
    """The fabric, loaded under an exclusive lock held until the block ends."""
    path = Path(path)
    lock_path = path.with_suffix(".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield Fabric.load(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def create(path: Path, topology: Topology, switches: dict[str, tuple[str, int]],
           lanes: int = DEFAULT_LANES) -> Fabric:
    fabric = Fabric(Path(path), topology.spec,
                    {name: {"address": a, "device_id": d} for name, (a, d) in switches.items()},
                    lanes=lanes)
    fabric.save()
    return fabric
