"""A whole system in virtual time: switches (soft-target pipelines), links, the control plane's
part, and one worker per server, with faults drawn from a seed.

``run_seed`` is one trial: a call with the seed's faults at their moments, then, with every
fault repaired and every failed worker started afresh, a second call on the same job. It
checks what a user would: no worker returns a wrong sum; every worker that survives ends,
with its sum or an error that names the fault, before its deadline; where the fault leaves a
way on (a switch or a NIC of a BCube, the controller, garbled frames) the sums are right;
the next call works. A failing seed prints the command that replays it.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

import numpy as np

from bml.cost_model import Prediction, predict
from bml.protocol import DEFAULT_LANES, wire
from bml.schedule import DEFAULT_WINDOW, SCHEDULES, make_schedule
from bml.topology import Topology
from control_plane.jobs import plan_scheduled_job
from hosts.membership import Membership
from hosts.quantize import ExpectedSum
from simulation.network import Clock, LinkShape, Network
from simulation.workers import SimWorker, State, WorkerWorld

JOB = 1
HEALTH_PERIOD = 0.5  # s: the health monitor's check period (control_plane/health.py)
FAULT_KINDS = ("switch", "switch-restored", "link", "link-restored", "worker-killed",
               "worker-frozen", "controller", "garbled")


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float  # s after the call starts
    target: str  # a switch name, "h<server>:<level>", "h<server>", or "controller"
    lasts: float = 0.0  # s until it is repaired (restored kinds), 0: until the call ends

    def __str__(self) -> str:
        repaired = f" for {self.lasts:.2f} s" if self.lasts else ""
        return f"{self.kind} {self.target} at {self.at:.3f} s{repaired}"


@dataclass
class Scenario:
    topo: str = "bcube:2,2"
    schedule: str = "in-network"
    floats: int = 4096
    rate: float = 100e6
    loss: float = 0.0
    reorder: float = 0.0
    timeout: float = 30.0
    start_timeout: float = 10.0
    window: int = 64
    lanes: int = DEFAULT_LANES  # values per packet: which P4 build the switches run
    faults: list[Fault] = field(default_factory=list)
    seed: int = 0

    def command(self) -> str:
        """The command that replays this trial."""
        return (f"bml-sim run --seed {self.seed} --topo {self.topo} --schedule {self.schedule} "
                f"--floats {self.floats} --rate {self.rate:g} --loss {self.loss:g}"
                + (f" --lanes {self.lanes}" if self.lanes != DEFAULT_LANES else ""))


@dataclass
class Verdict:
    scenario: Scenario
    problems: list[str]
    first_call: dict[int, str]  # server -> "ok" or its error
    gst: float  # the first call's time to the last worker's end (virtual s)
    events: int
    late: bool = False  # a fault that leaves a way on, after the first whole block

    @property
    def ok(self) -> bool:
        return not self.problems


class World(WorkerWorld):
    """Clock, network, pipelines programmed by the control plane's code, and the workers."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        self.clock = Clock()
        self.topology = Topology.parse(scenario.topo)
        shape = LinkShape(rate=scenario.rate, loss=scenario.loss, reorder=scenario.reorder)
        self.network = Network(self.clock, self.topology, shape, self.rng, self._deliver,
                               wire=wire(scenario.lanes))
        self.job = plan_scheduled_job(self.topology, JOB, scenario.schedule,
                                      pool_size=scenario.window)
        for switch in self.topology.switches:
            self.network.provision(switch.name)
        self.network.install_job(self.job)
        self.controller_alive = True
        self.unprovisioned: set[str] = set()  # restored switches the monitor has not seen
        self.schedule = make_schedule(self.topology, scenario.schedule)
        self.workers: dict[int, SimWorker] = {}
        self.connections = 0
        for server in range(self.topology.num_servers):
            self.workers[server] = self._new_worker(server)

    def _new_worker(self, server: int) -> SimWorker:
        s = self.scenario
        plan = Membership.of(JOB, server, self.topology, self.schedule)
        return SimWorker(self, plan, s.window, s.timeout, s.start_timeout)

    def new_connection_id(self) -> int:
        self.connections += 1
        return self.connections

    def _deliver(self, server: int, level: int, payload: bytes) -> None:
        self.workers[server].on_frame(level, payload)

    # --- the control plane's part ------------------------------------------------------
    def _monitor(self, name: str) -> None:
        """The health monitor finds a restored switch and re-provisions it."""
        if not self.controller_alive or name not in self.unprovisioned:
            return
        if self.network.pipeline(name) is None:
            return
        self.unprovisioned.discard(name)
        self.network.provision(name)
        for group in self.job.groups:
            if group.switch == name:
                self.network.install_group(group)

    # --- faults --------------------------------------------------------------------------
    def inject(self, fault: Fault) -> None:
        kind, target = fault.kind, fault.target
        if kind.startswith("switch"):
            self.network.kill_switch(target)
            if fault.lasts:
                self.clock.after(fault.lasts, self._restore_switch, target)
        elif kind.startswith("link"):
            server, level = _nic(target)
            self.network.set_link(server, level, False)
            if fault.lasts:
                self.clock.after(fault.lasts, self.network.set_link, server, level, True)
        elif kind == "worker-killed":
            self.workers[int(target[1:])].kill()
        elif kind == "worker-frozen":
            self.workers[int(target[1:])].freeze()
        elif kind == "controller":
            self.controller_alive = False
        elif kind == "garbled":
            server, level = _nic(target)
            self.network.corrupt_next(server, level, 1 + self.rng.randrange(8))

    def _restore_switch(self, name: str) -> None:
        self.network.restore_switch(name)
        self.unprovisioned.add(name)
        self.clock.after(HEALTH_PERIOD, self._monitor, name)

    def repair(self) -> None:
        """Everything back: switches, links, controller (which re-provisions what it missed)."""
        for switch in self.topology.switches:
            if self.network.pipeline(switch.name) is None:
                self.network.restore_switch(switch.name)
                self.unprovisioned.add(switch.name)
        for server in range(self.topology.num_servers):
            for level in range(self.topology.k):
                self.network.set_link(server, level, True)
        self.controller_alive = True
        for name in sorted(self.unprovisioned):
            self._monitor(name)

    # --- calls ---------------------------------------------------------------------------
    def call(self, grads: list[np.ndarray], faults: list[Fault],
             deadline: float) -> dict[int, SimWorker]:
        """Every live worker pushes its gradient; faults at their moments; runs until every
        worker that can still end has ended, or ``deadline`` (virtual s from now)."""
        start = self.clock.now
        for fault in faults:
            self.clock.at(start + fault.at, self.inject, fault)
        for server, worker in self.workers.items():
            if worker.state is not State.DEAD:
                worker.push(grads[server])

        last_fault = start + max((f.at + f.lasts for f in faults), default=0.0)

        def settled() -> bool:
            return self.clock.now >= last_fault and all(
                w.outcome is not None or w.state in (State.DEAD, State.FROZEN)
                for w in self.workers.values())

        self.clock.run_until(start + deadline, settled)
        return self.workers


def lossy_gst(topo: str, schedule: str, floats: int, rate: float, loss: float,
              reorder: float = 0.0, seed: int = 0) -> tuple[float, bool, int]:
    """(GST, every sum right, re-sends) of one fault-free call with ``loss`` each way on
    every link: the loss table's simulated twin (``benchmarks/faults.py``), timed as it is,
    after a warm-up call that makes the mesh, with every worker starting together."""
    world = _gst_world(topo, schedule, floats, rate, DEFAULT_LANES, seed, loss, reorder)
    servers = world.topology.num_servers
    call = _timed_call(world, gradients(np.random.default_rng(seed), servers, floats), [])
    resent = sum(w.outcome.stats.retransmissions for w in world.workers.values()
                 if w.outcome is not None and w.outcome.stats)
    return call.gst, call.correct, resent


def gradients(rng: np.random.Generator, servers: int, floats: int) -> list[np.ndarray]:
    return [rng.standard_normal(floats).astype(np.float32) * (1 + s) for s in range(servers)]


@dataclass
class GstRun:
    """One fault-free call of every server, timed as the emulation's benchmarks time it (after
    a warm-up call that also makes the mesh): its GST, whether every sum is right, and the
    bytes each NIC put on its link each way (``[server][level] = (up, down)``, every header
    counted), beside the cost model's prediction of both."""

    scenario: Scenario
    gst: float
    correct: bool
    nic_bytes: list[list[tuple[int, int]]]
    prediction: Prediction

    @property
    def busiest(self) -> tuple[int, int]:
        """(most bytes one NIC sent, most bytes one NIC received)."""
        return (max(up for nics in self.nic_bytes for up, _ in nics),
                max(down for nics in self.nic_bytes for _, down in nics))


def _gst_world(topo: str, schedule: str, floats: int, rate: float, lanes: int,
               seed: int, loss: float = 0.0, reorder: float = 0.0) -> World:
    """A world for timed calls, warmed up as the emulation's benchmarks warm up (a first
    call makes the mesh and is a barrier)."""
    scenario = Scenario(topo, schedule, floats, rate, loss, reorder, lanes=lanes,
                        timeout=3600.0, start_timeout=60.0, window=DEFAULT_WINDOW, seed=seed)
    world = World(scenario)
    world.call([np.ones(64, np.float32)] * world.topology.num_servers, [], 600.0)
    return world


@dataclass
class TimedCall:
    """One call of every worker in a world: when it started, its GST, and how many workers
    ended with an error or with a wrong sum."""

    start: float
    gst: float
    errors: int
    wrong: int

    @property
    def correct(self) -> bool:
        return not self.errors and not self.wrong


def _timed_call(world: World, grads: list[np.ndarray], faults: list[Fault]) -> TimedCall:
    start = world.clock.now
    world.call(grads, faults, 3600.0)
    outcomes = [w.outcome for w in world.workers.values()]
    expected = ExpectedSum(grads, world.scenario.lanes)
    ended = [o for o in outcomes if o is not None and o.error is None]
    wrong = sum(1 for o in ended if wrong_sum(o.result, expected) is not None)
    gst = max((o.ended for o in outcomes if o is not None), default=start) - start
    return TimedCall(start, gst, len(outcomes) - len(ended), wrong)


def simulated_gst(topo: str, schedule: str, floats: int, rate: float,
                  lanes: int = DEFAULT_LANES, seed: int = 0) -> GstRun:
    """The whole call of ``schedule`` on ``topo`` in virtual time, the real engine and switch
    code on links of ``rate`` bits/s each way (the cost model's setting: no loss)."""
    world = _gst_world(topo, schedule, floats, rate, lanes, seed)
    servers = world.topology.num_servers
    grads = gradients(np.random.default_rng(seed), servers, floats)
    counters = world.network.counters
    before = {key: direction.bytes for key, direction in counters.items()}
    call = _timed_call(world, grads, [])
    nic_bytes = [[(counters[(s, level, "up")].bytes - before[(s, level, "up")],
                   counters[(s, level, "down")].bytes - before[(s, level, "down")])
                  for level in range(world.topology.k)] for s in range(servers)]
    prediction = predict(make_schedule(world.topology, schedule), floats, rate,
                         wire=wire(lanes))
    return GstRun(world.scenario, call.gst, call.correct, nic_bytes, prediction)


@dataclass
class FailoverRun:
    """A call with a switch killed part-way through, beside the same call without the fault:
    when the workers gave up on the old plan (detection) and held their first sum of the new
    one (recovery), and the new plan's attempt against the cost model's GST of the degraded
    schedule (the emulation's ``benchmarks/faults.py`` measures the same on bcube:3,2)."""

    switch: str
    fault_at: float  # virtual s after the call's start
    no_fault_gst: float
    gst: float  # the faulted call: its start to the last worker's end
    correct: bool  # every worker returned the right sum
    errors: int  # workers that ended with an error instead (none returned a wrong sum: asserted)
    replanned: int  # workers that re-planned
    detection: float  # the fault to the last worker giving up on the old plan
    recovery: float  # the fault to the last worker's first whole block of the new plan
    degraded_gst: float  # the new plan's attempt alone, the slowest worker's
    predicted: float  # the cost model's GST of the degraded schedule


def failover_gst(topo: str, schedule: str, floats: int, rate: float, switch: str,
                 at: float, lanes: int = DEFAULT_LANES, seed: int = 0) -> FailoverRun:
    """``switch`` killed ``at`` (a fraction) of the way through a call of ``schedule`` on
    ``topo``, in virtual time: a fault-free call first gives the GST the fraction is of."""
    world = _gst_world(topo, schedule, floats, rate, lanes, seed)
    servers = world.topology.num_servers
    rng = np.random.default_rng(seed)
    no_fault = _timed_call(world, gradients(rng, servers, floats), []).gst
    fault_at = at * no_fault
    call = _timed_call(world, gradients(rng, servers, floats),
                       [Fault("switch", fault_at, switch)])
    assert not call.wrong, f"{call.wrong} worker(s) returned a wrong sum"
    failed = call.start + fault_at
    replans = [(w.outcome.replans, w.outcome.stats) for w in world.workers.values()
               if w.outcome is not None and w.outcome.replans and w.outcome.stats]
    dead = next(s for s in world.topology.switches if s.name == switch)
    degraded = make_schedule(world.topology, schedule).degraded({(dead.level, dead.index)})
    nan = float("nan")
    return FailoverRun(
        switch, fault_at, no_fault, call.gst, call.correct, call.errors, len(replans),
        max((r[0].gave_up_at for r, _ in replans), default=nan) - failed,
        max((r[-1].resumed_at for r, _ in replans), default=nan) - failed,
        max((stats.seconds for _, stats in replans), default=nan),
        predict(degraded, floats, rate, wire=wire(lanes)).gst)


def wrong_sum(result: np.ndarray | None, expected: ExpectedSum) -> str | None:
    """None if ``result`` is the sum within the quantiser's stated bound, else what is
    wrong."""
    if result is None or result.shape != expected.shape:
        return "no result of the right shape"
    error, bound, ok = expected.check(result)
    if ok:
        return None
    return f"off by up to {error:.3g}, more than the bound ({bound:.3g} at most)"


def draw_faults(rng: random.Random, topology: Topology, duration: float,
                kinds: tuple[str, ...] = FAULT_KINDS) -> list[Fault]:
    """One fault of a kind drawn from ``kinds``, at any moment of a call that takes about
    ``duration``: from its start to past its last packets."""
    kind = rng.choice(kinds)
    at = rng.choice((0.0, rng.uniform(0, 1.1) * duration, duration * rng.uniform(0.9, 1.0)))
    server = rng.randrange(topology.num_servers)
    level = rng.randrange(topology.k)
    lasts = rng.uniform(0.2, 3.0) if kind.endswith("restored") else 0.0
    if kind.startswith("switch"):
        target = rng.choice(topology.switches).name
    elif kind.startswith("link") or kind == "garbled":
        target = f"h{server}:{level}"
    elif kind.startswith("worker"):
        target = f"h{server}"
    else:
        target = "controller"
    return [Fault(kind, at, target, lasts)]


def expected_to_finish(fault: Fault, topology: Topology) -> bool:
    """Whether every worker must still return the right sum with ``fault``: a switch or a NIC
    of a BCube that stays down is re-planned around; the controller's death changes nothing
    for installed jobs; garbled frames are dropped and re-sent."""
    if fault.kind in ("controller", "garbled"):
        return True
    if fault.kind in ("switch", "link"):
        return topology.k > 1
    return False


def run_seed(seed: int, topo: str = "bcube:2,2", schedule: str | None = None,
             floats: int = 4096, rate: float = 100e6, loss: float = 0.0,
             kinds: tuple[str, ...] = FAULT_KINDS, duration: float | None = None,
             lanes: int = DEFAULT_LANES) -> Verdict:
    """One trial (see the module's docstring), replayable from its arguments."""
    rng = random.Random(zlib.crc32(f"{seed}:{topo}".encode()))
    topology = Topology.parse(topo)
    drawn = rng.choice(SCHEDULES)  # drawn always, so that naming it replays the same faults
    if schedule is None:
        schedule = drawn if topology.k > 1 else "in-network"
    if duration is None:
        duration = fault_free_duration(topo, schedule, floats, rate, lanes)
    faults = draw_faults(rng, topology, duration, kinds)
    return run_trial(Scenario(topo, schedule, floats, rate, loss, lanes=lanes, faults=faults,
                              seed=seed))


def run_trial(scenario: Scenario) -> Verdict:
    """A call with the scenario's faults, then the next run (see the module's docstring)."""
    seed, topo, schedule = scenario.seed, scenario.topo, scenario.schedule
    floats, rate, faults = scenario.floats, scenario.rate, scenario.faults
    topology = Topology.parse(topo)
    world = World(scenario)
    data = np.random.default_rng(seed)
    grads = gradients(data, topology.num_servers, floats)
    # The deadline: each worker's own bound (its timeouts; a re-planning starts a new call
    # with its own), and a margin for the clock to reach it.
    deadline = 3 * (scenario.timeout + scenario.start_timeout)
    world.call(grads, faults, deadline)
    expected = ExpectedSum(grads, scenario.lanes)
    problems = []
    first = {}
    must_finish = all(expected_to_finish(f, topology) for f in faults)
    ends = []
    for server, worker in world.workers.items():
        if worker.state is State.DEAD:
            first[server] = "killed"
            continue
        outcome = worker.outcome
        if worker.state is State.FROZEN:
            first[server] = "frozen"
            continue
        if outcome is None:
            problems.append(f"server {server} did not end within {deadline:g} s "
                            f"(state {worker.state.value})")
            first[server] = "hung"
            continue
        ends.append(outcome.ended)
        if outcome.error is not None:
            first[server] = outcome.error
            if must_finish:
                problems.append(f"server {server} failed although {faults[0]} leaves a way on:"
                                f" {outcome.error}")
            continue
        wrong = wrong_sum(outcome.result, expected)
        first[server] = "ok" if wrong is None else wrong
        if wrong is not None:
            problems.append(f"server {server} returned a wrong sum: {wrong}")
    gst = max(ends, default=0.0)
    # Past the first whole block a re-run cannot gather everyone (a worker may return its sum
    # unaffected): those who miss blocks get them from one that holds the sum instead
    # (docs/PROTOCOL.md, "A failure at the end"). Such trials are counted apart.
    late = bool(must_finish and faults and min(f.at for f in faults) >= first_result_at(
        topo, schedule, floats, rate, scenario.lanes))
    # The next run: everything repaired, every worker a fresh process (as `bml-host push`).
    world.repair()
    for server, worker in list(world.workers.items()):
        if worker.state is not State.DEAD:
            worker.close_mesh()
            worker.state = State.DEAD
        world.workers[server] = world._new_worker(server)
    world.clock.run_until(world.clock.now + 1.0)  # closings reach the neighbours
    grads = gradients(data, topology.num_servers, floats)
    world.call(grads, [], deadline)
    expected = ExpectedSum(grads, scenario.lanes)
    for server, worker in world.workers.items():
        outcome = worker.outcome
        if outcome is None:
            problems.append(f"next call: server {server} did not end (state "
                            f"{worker.state.value})")
        elif outcome.error is not None:
            problems.append(f"next call: server {server} failed: {outcome.error}")
        else:
            wrong = wrong_sum(outcome.result, expected)
            if wrong is not None:
                problems.append(f"next call: server {server} returned a wrong sum: {wrong}")
    return Verdict(scenario, problems, first, gst, world.clock.pending(), late)


_FAULT_FREE: dict[tuple, tuple[float, float]] = {}


def _fault_free(topo: str, schedule: str, floats: int, rate: float,
                lanes: int) -> tuple[float, float]:
    """(the earliest first whole block, the last end) of a fault-free call (virtual s)."""
    key = (topo, schedule, floats, rate, lanes)
    if key not in _FAULT_FREE:
        scenario = Scenario(topo, schedule, floats, rate, lanes=lanes, seed=-1)
        world = World(scenario)
        grads = gradients(np.random.default_rng(0), world.topology.num_servers, floats)
        world.call(grads, [], scenario.timeout)
        outcomes = [w.outcome for w in world.workers.values() if w.outcome is not None]
        firsts = [o.stats.first_result for o in outcomes if o.stats is not None]
        _FAULT_FREE[key] = (min(firsts, default=0.0), max((o.ended for o in outcomes),
                                                          default=1.0))
    return _FAULT_FREE[key]


def fault_free_duration(topo: str, schedule: str, floats: int, rate: float,
                        lanes: int = DEFAULT_LANES) -> float:
    """How long a fault-free call of this kind takes (virtual s), to place faults in it."""
    return _fault_free(topo, schedule, floats, rate, lanes)[1]


def first_result_at(topo: str, schedule: str, floats: int, rate: float,
                    lanes: int = DEFAULT_LANES) -> float:
    """When the first worker of a fault-free call holds its first whole block."""
    return _fault_free(topo, schedule, floats, rate, lanes)[0]


def _nic(target: str) -> tuple[int, int]:
    server, level = target[1:].split(":")
    return int(server), int(level)
