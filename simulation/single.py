"""One-NIC workers (``bml-host push --interface``) in the simulator: the real
``hosts.single.SingleSwitchCall`` of each worker, one soft-target pipeline for their switch,
the simulated links in virtual time.

The BCube workers of ``simulation/workers.py`` need a mesh; these only a switch. A run sets a
single-level job up on a star the way ``bml-ctl job-add`` does, starts every worker's call
(each after its own ``starts`` delay), and can kill the switch or a worker at a moment.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from bml.protocol import DEFAULT_LANES, ONE_NIC_WINDOW, job_udp_port, wire
from bml.topology import Topology
from control_plane.jobs import plan_job
from hosts.recovery import NicState
from hosts.single import SingleSwitchCall
from simulation.network import Clock, LinkShape, Network

JOB = 7


@dataclass
class OneNicOutcome:
    """What each worker's call ended with (None: it never ended: killed or hung)."""

    results: list[np.ndarray | None] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    ended: list[float | None] = field(default_factory=list)
    retransmissions: int = 0

    @property
    def gst(self) -> float:
        return max((t for t in self.ended if t is not None), default=float("nan"))


class OneNicRun:
    """``workers`` one-NIC workers of one job on star:``workers``; the switch runs the
    ``lanes``-wide build, the workers send ``host_lanes`` (default: the same) values per
    packet."""

    def __init__(self, workers: int, rate: float = 100e6, loss: float = 0.0, seed: int = 0,
                 window: int = ONE_NIC_WINDOW, timeout: float = 60.0,
                 start_timeout: float = 10.0, lanes: int = DEFAULT_LANES,
                 host_lanes: int | None = None) -> None:
        self.workers = workers
        self.clock = Clock()
        self.topology = Topology.parse(f"star:{workers}")
        self.network = Network(self.clock, self.topology, LinkShape(rate=rate, loss=loss),
                               random.Random(seed), self._deliver, wire=wire(lanes))
        self.host_wire = wire(host_lanes or lanes)
        for switch in self.topology.switches:
            self.network.provision(switch.name)
        self.network.install_job(plan_job(self.topology, JOB, list(range(workers)), 0,
                                          max(window, 64)))
        self.window, self.timeout, self.start_timeout = window, timeout, start_timeout
        switch_ip = self.topology.switches[0].ip
        self.nics = [NicState(0, switch_ip) for _ in range(workers)]
        self.generations: list[int | None] = [None] * workers
        self.calls: list[SingleSwitchCall | None] = [None] * workers
        self.timer_at = [float("inf")] * workers
        self.killed: set[int] = set()
        self.outcome = OneNicOutcome()

    def call(self, grads: list[np.ndarray], starts: list[float] | None = None,
             limit: float = 600.0) -> OneNicOutcome:
        """Every worker's allreduce of its gradient; virtual time runs until all ended or
        ``limit`` more seconds passed."""
        n = self.workers
        self.outcome = OneNicOutcome([None] * n, [None] * n, [None] * n)
        self.calls = [None] * n
        self.timer_at = [float("inf")] * n
        begin = self.clock.now
        for worker in range(n):
            if worker not in self.killed:
                delay = starts[worker] if starts else 0.0
                self.clock.at(begin + delay, self._start, worker, grads[worker].ravel())
        self.clock.run_until(begin + limit, stop=self._all_ended)
        self.outcome.retransmissions = sum(c.stats.retransmissions for c in self.calls if c)
        for worker, ended in enumerate(self.outcome.ended):
            if ended is not None:
                self.outcome.ended[worker] = ended - begin
        return self.outcome

    def kill_switch_at(self, when: float) -> None:
        self.clock.at(when, self.network.kill_switch, self.topology.switches[0].name)

    def kill_worker_at(self, when: float, worker: int) -> None:
        self.clock.at(when, self.killed.add, worker)

    def _all_ended(self) -> bool:
        return all(w in self.killed or self.outcome.ended[w] is not None
                   for w in range(self.workers))

    def _start(self, worker: int, flat: np.ndarray) -> None:
        last, self.generations[worker] = self.generations[worker], None
        call = self.calls[worker] = SingleSwitchCall(
            JOB, worker, self.workers, self.nics[worker], flat, last, self.clock.now,
            self.window, self.timeout, self.start_timeout, self.host_wire)
        self._pump(worker, call)

    def _deliver(self, worker: int, level: int, payload: bytes) -> None:
        call = self.calls[worker]
        if call is not None and worker not in self.killed:
            call.on_frame(self.clock.now, level, payload)
            self._pump(worker, call)

    def _timer(self, worker: int, call: SingleSwitchCall) -> None:
        if call is not self.calls[worker] or worker in self.killed:
            return
        self.timer_at[worker] = float("inf")
        if self.clock.now >= call.next_wake():
            call.on_timer(self.clock.now)
        self._pump(worker, call)

    def _pump(self, worker: int, call: SingleSwitchCall) -> None:
        if worker in self.killed or self.outcome.ended[worker] is not None:
            return
        for level, frame in call.take_frames():
            self.network.send_frame(worker, level, job_udp_port(JOB), frame)
        if call.error is not None or call.result is not None:
            self.outcome.ended[worker] = self.clock.now
            self.outcome.results[worker] = call.result
            self.outcome.errors[worker] = None if call.error is None else str(call.error)
            if call.error is None:
                self.generations[worker] = call.generation
            return
        wake = max(call.next_wake(), self.clock.now)
        if wake < self.timer_at[worker]:
            self.timer_at[worker] = wake
            self.clock.at(wake, self._timer, worker, call)
