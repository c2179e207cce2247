"""The BCube executor: one worker drives all k of its NICs at once through a schedule.

The engine is the I/O of a worker and nothing else: one UDP socket per NIC (to its switch),
the TCP mesh to the BCube neighbours (``hosts/mesh.py``), and one event loop over both that
feeds a ``hosts.call.Call`` (the state machine of one allreduce, which does no I/O) what
arrives and when its timer is due, and sends what it asks to send. Between calls it keeps
what outlives a call: the NICs' answer times and re-send budgets, the last good generation,
and the ``Membership`` (the schedule, re-planned around a failed part; the survivors of an
elastic job), reconnecting the mesh over detours when that changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from bml.protocol import DEFAULT_WIRE, HEADER_BYTES, MTU, PacketType, Wire, generation_question
from bml.schedule import (
    DEFAULT_WINDOW,
    Schedule,
    mesh_is_control_only,
    stream_budgets,
)
from bml.topology import Topology
from hosts.buffers import CallBuffers
from hosts.call import Call
from hosts.connector import MeshSwitchCheck
from hosts.errors import TransportError
from hosts.loop import NicSocket, drive
from hosts.membership import Membership, PartFailed, PeerKey, WorkerLost
from hosts.mesh import Mesh, MeshError
from hosts.recovery import START_DEADLINE, NicState
from hosts.stats import CallStats, Replan

__all__ = ["CallStats", "Engine", "Replan"]


class _SwitchCheck:
    """The mesh's question while neighbours have not connected yet: are their levels'
    switches dead? (``MeshSwitchCheck`` decides; this asks on the NIC sockets and re-plans.)
    Polled by ``Mesh.establish``; never blocks."""

    def __init__(self, engine: Engine, mesh: Mesh) -> None:
        self.engine, self.mesh = engine, mesh
        self.check = MeshSwitchCheck(set(engine.plan.live_levels()), engine.nic_states,
                                     time.monotonic(), engine.start_timeout > START_DEADLINE)

    @property
    def asking(self) -> bool:
        return self.check.asking

    def poll(self, missing: set[int], expired: bool) -> bool:
        """Ask what is due and read the answers; re-plan around the silent switches of
        levels still ``missing`` neighbours once their round is over (True: the mesh's
        detours changed)."""
        now = time.monotonic()
        silent = self.check.poll(now, missing & set(self.engine.plan.live_levels()), expired)
        self.engine.ask(self.check, now)
        if not self.engine.replan_around(self.mesh, silent):
            return False
        self.check.replanned(set(self.engine.plan.live_levels()), now)
        return True

    def went_around(self, level: int, server: int) -> bool:
        """Neighbour ``server`` goes around this worker's ``level`` switch (it found it
        silent, or its own link to it down): re-plan around it too."""
        home = self.engine.plan.home_of(server)
        return self.engine.replan_around(
            self.mesh, {level}, f"gone around by server {home}: it, or a link to it, is down")


class Engine:
    """A worker of one job on every NIC of its server; keep it for many calls."""

    def __init__(self, job: int, server: int, topology: Topology, schedule: Schedule,
                 nics: list[tuple[str, str]], window: int = DEFAULT_WINDOW,
                 timeout: float = 60.0,
                 start_timeout: float = 10.0, elastic: bool = False,
                 wire: Wire = DEFAULT_WIRE) -> None:
        """``nics``: (own address, switch address) per level. ``elastic``: on a star, when a
        worker leaves mid-call the others go on without it (``Membership.shrunk``).
        ``wire``: the lane width of the job's switches (recorded with the job)."""
        self.plan = Membership.of(job, server, topology, schedule, elastic)
        self.wire = wire
        self.window, self.timeout, self.start_timeout = window, timeout, start_timeout
        self.buffers = CallBuffers()  # the calls' large arrays, one call after the other
        self.calls = 0  # on this mesh: a call's tag (a new mesh starts again, on every end)
        # A failure the last call saw after it had its result (a part down, a neighbour
        # gone): re-planned, or the mesh made again, before the next call.
        self.aftermath: PartFailed | WorkerLost | None = None
        self.connect_replans: list[Replan] = []  # re-planned while the mesh was made
        # The last call's generation if it ended well; None: ask the switches (a fresh worker,
        # or one whose last call failed and may have left state behind).
        self.generation: int | None = None
        self.nic_states = [NicState(level, switch_ip)
                           for level, (_ip, switch_ip) in enumerate(nics)]
        self.links: list[NicSocket] = []
        try:
            for level, (ip, switch_ip) in enumerate(nics):
                self.links.append(NicSocket.open(level, ip, switch_ip, job))
            self.mesh = self._connect()
        except BaseException:
            self.close()
            raise

    # What the API and the CLI read of the membership.
    @property
    def job(self) -> int:
        return self.plan.job

    @property
    def schedule(self) -> Schedule:
        return self.plan.schedule

    @property
    def members(self) -> list[int]:
        return list(self.plan.members)

    @property
    def whole(self) -> Topology:
        return self.plan.whole

    @property
    def home(self) -> int:
        return self.plan.home

    def _connect(self) -> Mesh:
        """The mesh to the neighbours, over detours on the levels the schedule has broken.

        Neighbours that cannot be reached on a level whose switch does not answer either
        (down before the call started) are reached over that level's detour: the
        membership is re-planned around the switch, and the connections made stay. The
        switches are asked as the mesh starts, and again at the start timeout
        (``_SwitchCheck``)."""
        plan = self.plan
        self.calls = 0
        mesh = Mesh(plan.job, plan.server, plan.topology, self.start_timeout, plan.detours(),
                    plan.addresses(), stream_budgets(plan.schedule, plan.server),
                    mesh_is_control_only(plan.schedule, plan.server), connect=False)
        try:
            mesh.establish(self.start_timeout, _SwitchCheck(self, mesh))
        except (MeshError, TransportError) as exc:
            mesh.close(linger=0.0)
            raise TransportError(str(exc)) from None
        return mesh

    def ask(self, check: MeshSwitchCheck, now: float) -> None:
        """Send the questions due, and take the answers waiting on the NICs' sockets (no
        call runs: anything else there is a late frame of an earlier one)."""
        plan = self.plan
        me = plan.topology.digits(plan.server)
        for level in check.due(now):
            self.links[level].send(generation_question(plan.probe_job(), me[level], self.wire))
        buffer = bytearray(MTU)
        for level, link in enumerate(self.links):
            link.drain()
            while True:
                try:
                    size = link.sock.recv_into(buffer)
                except (BlockingIOError, InterruptedError):
                    break
                if size >= HEADER_BYTES and buffer[0] == PacketType.GENERATION:
                    check.answered(level)

    def replan_around(self, mesh: Mesh, silent_levels: set[int],
                      why: str = "did not answer while the mesh was made: down or cut off"
                      ) -> bool:
        """Re-plan around this worker's switches of ``silent_levels`` (False if none): the
        mesh then dials over their detours. TransportError if there is no plan around
        them."""
        around = self.plan.around(silent_levels, why)
        if around is None:
            return False
        plan, cause = around
        self.plan = plan
        self.connect_replans.append(Replan(cause, plan.schedule.describe(), time.monotonic()))
        mesh.detours = plan.detours()
        return True

    def close(self) -> None:
        for link in self.links:
            link.sock.close()
        self.links = []
        mesh = getattr(self, "mesh", None)
        if mesh is not None:
            mesh.close()

    def allreduce(self, values: np.ndarray,
                  progress: Callable[[int, int], None] | None = None,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, CallStats]:
        """Sum of ``values`` (flat float32) over the job's N servers (in ``out`` if given,
        written only when the sum is complete), and the call's stats.

        A switch or link that fails mid-call is re-planned around (every worker learns of it
        from the ABORT that names it) and the call runs again on the degraded schedule, which
        the engine keeps for its later calls."""
        flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
        started = time.monotonic()
        self._recover()
        replans, self.connect_replans = self.connect_replans, []
        while True:
            self.calls += 1
            generation, self.generation = self.generation, None
            call = Call(self.plan, self.nic_states, flat, self.calls, generation,
                        time.monotonic(), self.window, self.timeout, self.start_timeout,
                        self.wire, progress, backlog=lambda level: bool(self.links[level].outbox),
                        buffers=self.buffers, queued=self._queued, out=out)
            try:
                self._drive(call)
            except MeshError as exc:
                call.error = TransportError(str(exc))
            error = call.error
            if error is None:
                break
            if isinstance(error, PartFailed):
                self.mesh.abort(call.tag, str(error), error.broken)
                gave_up_at = time.monotonic()
                if replans:
                    replans[-1].resumed_at = call.stats.first_result or gave_up_at
                try:
                    self._change(self.plan.replanned(error))
                except TransportError as exc:
                    raise TransportError(
                        f"{error}; re-planning around it failed: {exc} (a neighbour that "
                        "already had the whole sum may have ended its call)") from None
                replans.append(Replan(str(error), self.schedule.describe(), gave_up_at))
            elif isinstance(error, WorkerLost):
                self.mesh.abort(call.tag, str(error), lost=error.lost)
                gave_up_at = time.monotonic()
                self._change(self.plan.shrunk(error))
                survivors = (f"servers {', '.join(map(str, self.members))} go on without "
                             f"{', '.join(map(str, sorted(error.lost)))} (elastic)")
                replans.append(Replan(str(error), [*self.schedule.describe(), survivors],
                                      gave_up_at))
            else:
                self.mesh.abort(call.tag, str(error))  # relayed: every worker names the cause
                raise TransportError(str(error)) from None
        stats = call.stats
        self.generation = call.generation
        if call.adopted:
            self.plan = self.plan.adopting(call.adopted)
        if call.failed_after_result is not None:
            failure = self.aftermath = call.failed_after_result
            self.mesh.abort(call.tag, str(failure), getattr(failure, "broken", None),
                            getattr(failure, "lost", None), summed=True)
        if replans:
            replans[-1].resumed_at = stats.first_result
        stats.replans = replans
        stats.attempt_seconds = stats.seconds
        stats.seconds = time.monotonic() - started  # failed attempts included
        stats.stream_bytes = sum(p.sent_bytes for p in self.mesh.all())
        return call.result, stats

    def _recover(self) -> None:
        """Before a call: re-plan around what the last one saw fail after its result, and
        make the mesh again if a neighbour's connection closed (it left, or was restarted:
        a new process starts its mesh, and its calls' tags, afresh)."""
        failure, self.aftermath = self.aftermath, None
        plan = self.plan.after(failure)
        if plan != self.plan or any(peer.closed for peer in self.mesh.all()):
            self._change(plan)

    def _change(self, plan: Membership) -> None:
        """Go on under a new membership (it raised TransportError if there is no way on):
        the mesh again, over detours where the schedule now has broken groups."""
        self.mesh.close(linger=1.0)
        self.plan = plan
        for nic in self.nic_states:
            nic.restart()
        self.mesh = self._connect()

    def _queued(self, key: PeerKey) -> bool:
        peer = self.mesh.peers.get(key)
        return peer is not None and bool(peer.outbox)

    def _drive(self, call: Call) -> None:
        drive(call, self.links, self.mesh.peers, call.tag,
              f"job {self.job} server {self.home}")
