"""The Python API: ``allreduce(array, ...)`` sums an array over a job's workers.

By default a worker uses every NIC of its server: it finds its NICs, switches, server number
and the topology itself (``hosts/discovery.py``) and runs the job's schedule with the BCube
executor (``hosts/engine.py``). Given ``interface``, it uses that one NIC and its switch only
(a single-level job, ``hosts/transport.py``).
"""

from __future__ import annotations

import re
import subprocess

import numpy as np

from bml.cost_model import choose
from bml.protocol import DEFAULT_LANES, WidthError, Wire, wire
from bml.schedule import (
    AUTO,
    DEFAULT_WINDOW,
    SCHEDULES,
    Schedule,
    ScheduleError,
    make_schedule,
    one_nic_window,
)
from bml.topology import Topology
from hosts.discovery import DiscoveryError, local_nics, locate, nic_counters
from hosts.engine import Engine
from hosts.errors import TransportError
from hosts.quantize import GradientError, check_gradient, check_out
from hosts.stats import CallStats
from hosts.transport import AggregationTransport

__all__ = ["GradientError", "TransportError", "Worker", "allreduce", "interface_addresses",
           "resolve_schedule"]

PLAN_ELEMENTS = 1 << 22  # the gradient size "auto" plans for (the choice hardly depends on it)


def interface_addresses(interface: str) -> tuple[str, str]:
    """(own IPv4 address, switch address) of an interface in this namespace.

    The switch is the permanent neighbour whose address is x.y.255.z, as bml-net installs it.
    """
    addr = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", interface],
                          capture_output=True, text=True, check=False)
    match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", addr.stdout)
    if not match:
        raise TransportError(f"interface {interface!r} has no IPv4 address here "
                             f"({addr.stderr.strip() or 'no inet line'})")
    neigh = subprocess.run(["ip", "-4", "neigh", "show", "dev", interface], capture_output=True,
                           text=True, check=False)
    switches = re.findall(r"^(\d+\.\d+\.255\.\d+) ", neigh.stdout, re.M)
    if len(switches) != 1:
        raise TransportError(f"cannot tell the switch behind {interface}: expected one "
                             f"x.y.255.z neighbour, found {switches or 'none'}; pass --switch")
    return match.group(1), switches[0]


def recorded_job(fabric: str | None, job: int):
    """The control plane's plan of ``job`` (a ``control_plane.jobs.JobPlan``) when its file can
    be read here, else None."""
    if not fabric:
        return None
    from control_plane.fabric import Fabric  # only where the control plane's file is

    try:
        return Fabric.load(fabric).job(job)
    except (OSError, ValueError):
        return None


def job_wire(fabric: str | None, job: int, lanes: int | None = None) -> Wire:
    """The lane width to send at: ``lanes``, else the width of the switches the job was set
    up on (the control plane read it from their P4Info) when the fabric file can be read
    here, else the default build's. A switch of another width says so in its first answer
    (``bml.protocol.width_mismatch``)."""
    if lanes is None:
        plan = recorded_job(fabric, job)
        lanes = plan.lanes if plan is not None else DEFAULT_LANES
    try:
        return wire(lanes)
    except WidthError as exc:
        raise ValueError(str(exc)) from None


def resolve_schedule(topology: Topology, name: str | None, job: int,
                     fabric: str | None = None, wire: Wire | None = None) -> Schedule:
    """The schedule to run: ``name``, or (None) the one the job was set up with when the
    fabric file can be read here, else what the planner picks (``auto``) for the width."""
    if name is None:
        plan = recorded_job(fabric, job)
        name = plan.schedule if plan is not None else None
    name = name or AUTO
    if name == AUTO:
        return choose(topology, PLAN_ELEMENTS, wire=wire or job_wire(fabric, job))
    try:
        return make_schedule(topology, name)
    except ScheduleError as exc:
        raise ValueError(str(exc)) from None


def check_window(fabric: str | None, job: int, window: int) -> None:
    """A window wider than the job's slot pool would send into slots the switch does not give
    the job, and wait out the timeout: refuse it at once when the pool is known."""
    plan = recorded_job(fabric, job)
    if plan is None or not plan.groups:
        return
    pool = min(group.pool_size for group in plan.groups)
    if window > pool:
        raise ValueError(f"window {window} is wider than job {job}'s pool of {pool} slots per "
                         f"switch: use --window {pool} or less, or set the job up with "
                         f"--pool {window}")


class Worker:
    """A worker of one job; keep it to run many allreduce calls.

    Without ``interface``: every NIC of this server, the job's schedule (``schedule`` =
    auto, in-network, host-based or mixed overrides it); ``rank`` and ``world``, if given,
    must be this server's number and the topology's server count; ``elastic`` (default: as
    the job was set up, when its fabric file is readable here) goes on without a worker that
    leaves mid-call, on a star. With ``interface``: that NIC's switch only, as worker ``rank``
    of ``world``. ``lanes``: values per packet (default: as the job was set up, see
    ``job_wire``)."""

    def __init__(self, job: int, rank: int | None = None, world: int | None = None,
                 interface: str | None = None, switch: str | None = None,
                 local_ip: str | None = None, window: int | None = None,
                 timeout: float = 60.0,
                 start_timeout: float = 10.0, schedule: str | None = None,
                 fabric: str | None = None, elastic: bool | None = None,
                 lanes: int | None = None) -> None:
        self.schedule: Schedule | None = None
        self.wire = job_wire(fabric, job, lanes)
        self.engine: Engine | None = None
        self.transport: AggregationTransport | None = None
        self.interfaces: list[str] = []
        if interface is not None or switch is not None or local_ip is not None:
            if rank is None or world is None:
                raise ValueError("one NIC (--interface) needs --rank and --world")
            if elastic:
                raise ValueError("--elastic needs every NIC (the job's schedule), not "
                                 "--interface")
            if not 0 <= rank < world:
                raise ValueError(f"rank {rank} is not in 0..{world - 1}")
            interface = interface or "eth0"
            if local_ip is None or switch is None:
                own, behind = interface_addresses(interface)
                local_ip = local_ip or own
                switch = switch or behind
            self.transport = AggregationTransport(job, rank, world, local_ip, switch,
                                                  window or one_nic_window(self.wire),
                                                  timeout, start_timeout, self.wire)
            self.interfaces = [interface]
        else:
            if schedule is not None and schedule not in (AUTO, *SCHEDULES):
                raise ValueError(f"unknown schedule {schedule!r}: {AUTO}, "
                                 f"{', '.join(SCHEDULES)}")
            try:
                nics = local_nics()
                server, topology = locate(nics)
            except DiscoveryError as exc:
                raise TransportError(str(exc)) from None
            if world is not None and world != topology.num_servers:
                raise ValueError(f"--world {world}, but this server is in {topology.spec} with "
                                 f"{topology.num_servers} servers: a job on all NICs runs on "
                                 "every server")
            if rank is not None and rank != server:
                raise ValueError(f"--rank {rank}, but this is server {server} of "
                                 f"{topology.spec}")
            self.schedule = resolve_schedule(topology, schedule, job, fabric, self.wire)
            if elastic is None:
                plan = recorded_job(fabric, job)
                elastic = plan is not None and plan.elastic
            if elastic and topology.k != 1:
                raise ValueError(f"--elastic shrinks a job on a star only ({topology.spec} is "
                                 "a BCube, where a failed part is re-planned around instead)")
            window = window or DEFAULT_WINDOW
            check_window(fabric, job, window)
            self.interfaces = [nic.interface for nic in nics]
            self.engine = Engine(job, server, topology, self.schedule,
                                 [(nic.ip, nic.switch_ip) for nic in nics], window, timeout,
                                 start_timeout, elastic, self.wire)
        self.last_stats = CallStats()
        self.last_nic_bytes: list[tuple[int, int]] = []

    @property
    def workers(self) -> int | None:
        """How many workers the sums are over now (fewer after an elastic job shrank); None
        on one NIC (the ``world`` given)."""
        return None if self.engine is None else len(self.engine.members)

    @property
    def schedule_name(self) -> str:
        return self.schedule.name if self.schedule is not None else "single-switch"

    def allreduce(self, array: np.ndarray, progress=None,
                  out: np.ndarray | None = None) -> np.ndarray:
        """The sum of ``array`` over the job's workers, of its shape, in float32.

        ``out``: a float32 C-contiguous array of ``array``'s size to write the sum into (and
        return), which may be ``array`` itself: the sum then replaces the gradient, as
        torch.distributed.all_reduce does. It is written only once the whole sum is in, so
        a call that fails before that leaves it as it was. Without it every call's sum is a
        new array."""
        values = check_gradient(array)
        flat_out = check_out(out, values.size)
        before = nic_counters(self.interfaces)
        if self.engine is not None:
            result, self.last_stats = self.engine.allreduce(values, progress, flat_out)
        else:
            result, self.last_stats = self.transport.allreduce(values, progress, flat_out)
        after = nic_counters(self.interfaces)
        self.last_nic_bytes = [(tx1 - tx0, rx1 - rx0)
                               for (tx0, rx0), (tx1, rx1) in zip(before, after, strict=True)]
        return out if out is not None else result.reshape(values.shape)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.transport is not None:
            self.transport.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def allreduce(array: np.ndarray, job: int, rank: int | None = None, world: int | None = None,
              interface: str | None = None, switch: str | None = None,
              **options) -> np.ndarray:
    """Sum ``array`` over the workers of ``job``; float32, same shape (see ``Worker``)."""
    with Worker(job, rank, world, interface, switch, **options) as worker:
        return worker.allreduce(array)
