"""Workers in virtual time: the real ``hosts.call.Call`` and ``hosts.membership.Membership``,
driven the way ``hosts.engine.Engine`` drives them, over the simulated network.

What the engine does with sockets happens here with ``simulation.network``: frames go to
``Network.send_frame``, mesh messages down a reliable stream along the connection's route
(direct, or over relays where the schedule has the level broken), and what arrives is given
to the call with the virtual time. The mesh is made as ``Mesh.establish`` makes it, by the
engine's own ``hosts.connector`` (what to dial, over which NIC, what to keep, which switches
to plan around): a dial's handshake crosses the network (``Network.handshake``; a worker
that is not making its mesh refuses it, a lost one is given up after ``DIAL_WAIT``), and the
greetings travel on the connection as messages do. Closing a connection (a worker that
re-plans, stops or dies) reaches the other end after everything sent before it, as a FIN
does; messages of a connection that was replaced are dropped.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bml.protocol import HEADER_BYTES, PacketType, generation_question, job_udp_port
from bml.schedule import connection_limit, mesh_is_control_only, stream_budgets
from hosts.call import Call
from hosts.connector import MeshConnector, MeshSwitchCheck, Verdict
from hosts.errors import TransportError
from hosts.membership import Membership, PartFailed, PeerKey, WorkerLost
from hosts.mesh import (
    CONTROL_RTO_MIN_US,
    abort_messages,
    decode_message,
    hello_message,
    hello_of,
)
from hosts.recovery import START_DEADLINE, NicState
from hosts.stats import CallStats, Replan
from simulation.network import MIN_RTO, Clock, Network

CLOSE_DELAY = 0.3  # s a worker that gives up lingers (its ABORTs leave) before reconnecting


class State(enum.Enum):
    CONNECTING = "connecting"
    CALLING = "calling"
    IDLE = "idle"
    FAILED = "failed"
    DEAD = "dead"
    FROZEN = "frozen"


@dataclass
class Outcome:
    """How one worker's call ended: its sum, or its error, and when."""

    result: np.ndarray | None = None
    error: str | None = None
    ended: float = 0.0
    stats: CallStats | None = None
    replans: list[Replan] = field(default_factory=list)


@dataclass
class _Accepted:
    """A connection a neighbour dialled, accepted here and not adopted yet."""

    dialer: int  # its home
    via: int  # the NIC level it came in on
    route: list[tuple[int, int]]  # back to the dialer


class SimWorker:
    """One server's worker of one job."""

    def __init__(self, world: WorkerWorld, plan: Membership, window: int, timeout: float,
                 start_timeout: float) -> None:
        self.world = world
        self.clock: Clock = world.clock
        self.network: Network = world.network
        self.plan = plan
        self.home = plan.home
        self.window, self.timeout, self.start_timeout = window, timeout, start_timeout
        self.nics = [NicState(level, nic.ip) for level, nic in
                     enumerate(plan.whole.nics(self.home))]
        self.state = State.IDLE
        self.calls = 0
        self.generation: int | None = None
        self.linked: dict[int, int] = {}  # peer's home -> connection id
        self.inbox: dict[int, deque] = {}  # peer's home -> messages not yet given to a call
        self.closed: set[int] = set()  # peers' homes whose connection closed
        self.call: Call | None = None
        self.flat: np.ndarray | None = None
        self.outcome: Outcome | None = None
        self.replans: list[Replan] = []
        self.call_started = 0.0
        # While the mesh is made (``connect``): what to dial and keep, the switch questions,
        # the dials under way (key -> connection id, route), the connections accepted and
        # not adopted yet, and when the connect loop next has something due.
        self.connector: MeshConnector | None = None
        self.check: MeshSwitchCheck | None = None
        self.dialing: dict[PeerKey, tuple[int, list[tuple[int, int]]]] = {}
        self.accepted: dict[int, _Accepted] = {}
        self.connect_wake = float("inf")
        self.timer_at = float("inf")
        self.on_end: Callable[[SimWorker], None] | None = None
        self.aftermath: PartFailed | WorkerLost | None = None
        self.routes: dict[int, list[tuple[int, int]]] = {}  # peer's home -> its connection's
        # What the mesh looks like under a membership, asked for every stream message: kept
        # per membership (a new one on every re-planning), as a mesh keeps its sockets.
        self._mesh_of: tuple[Membership | None, dict[int, PeerKey], dict[int, int], float] = (
            None, {}, {}, MIN_RTO)

    # --- the mesh ------------------------------------------------------------------------
    def wanted(self) -> dict[int, PeerKey]:
        """Peer's home -> its key, under this worker's membership."""
        return self._mesh()[1]

    def _mesh(self) -> tuple[Membership | None, dict[int, PeerKey], dict[int, int], float]:
        """(membership, peer's home -> key, peer's home -> its connection's pacing window,
        the connections' least retransmission timeout)."""
        plan = self.plan
        if self._mesh_of[0] is not plan:
            wanted = {plan.home_of(s): (dim, s) for dim, s in plan.peers()}
            budgets = stream_budgets(plan.schedule, plan.server)
            detours = plan.detours()
            windows = {home: connection_limit(budgets[detours.get(dim, dim)], plan.topology.n)
                       for home, (dim, _s) in wanted.items()}
            # As hosts.mesh sets its sockets: a short least timeout where the mesh carries
            # only the calls' control messages.
            min_rto = (CONTROL_RTO_MIN_US / 1e6
                       if mesh_is_control_only(plan.schedule, plan.server) else MIN_RTO)
            self._mesh_of = (plan, wanted, windows, min_rto)
        return self._mesh_of

    def connect(self) -> None:
        """Make the mesh afresh (a new membership, or the start), as ``Engine._connect``
        does: ``MeshConnector`` decides what to dial and what to keep, ``MeshSwitchCheck``
        which switches to plan around; their handshakes and HELLOs cross the network."""
        self.close_mesh()
        self.state = State.CONNECTING
        self.calls = 0
        self.inbox.clear()
        self.closed.clear()
        now, plan = self.clock.now, self.plan
        self.connector = MeshConnector(plan.job, plan.server, plan.topology, plan.detours(),
                                       self.start_timeout, now)
        self.check = MeshSwitchCheck(set(plan.live_levels()), self.nics, now,
                                     self.start_timeout > START_DEADLINE)
        self.connect_wake = float("inf")
        self._connect_step()

    def _connect_step(self) -> None:
        """A turn of ``Mesh.establish``'s loop: the switch check, the dials due or given up."""
        connector, check = self.connector, self.check
        if self.state is not State.CONNECTING or connector is None or check is None:
            return
        now, plan = self.clock.now, self.plan
        expired = connector.expired(now)
        silent = check.poll(now, connector.missing_levels() & set(plan.live_levels()), expired)
        me = plan.topology.digits(plan.server)
        for level in check.due(now):
            self.network.send_frame(self.home, level, job_udp_port(plan.job),
                                    generation_question(plan.probe_job(), me[level],
                                                        self.network.wire))
        if silent:
            if not self._plan_around(silent, "did not answer while the mesh was made: down "
                                     "or cut off"):
                return
            check.replanned(set(self.plan.live_levels()), now)
        elif expired and not check.asking:
            self._end(error=connector.error())
            return
        for key in connector.stale_dials(now):
            connection, route = self.dialing.pop(key)
            self._reset(route, connection)
        for key, via in connector.dials(now):
            self._dial(key, via)
        wake = max(now, min(connector.next_wake(now), check.next_due()))
        if wake < self.connect_wake:
            self.connect_wake = wake
            self.clock.at(wake, self._connect_timer, connector)

    def _connect_timer(self, connector: MeshConnector) -> None:
        if connector is self.connector and self.clock.now >= self.connect_wake:
            self.connect_wake = float("inf")
            self._connect_step()

    def _plan_around(self, levels: set[int], why: str) -> bool:
        """As ``Engine.replan_around``: re-plan around this worker's switches of ``levels``
        (its mesh then dials over their detours); False if the push ended (no plan around
        them)."""
        try:
            around = self.plan.around(levels, why)
        except TransportError as exc:
            self._end(error=str(exc))
            return False
        if around is None:
            return True
        self.plan, cause = around
        self.replans.append(Replan(cause, self.plan.schedule.describe(), self.clock.now))
        if self.connector is not None:
            self.connector.replanned(self.plan.detours(), self.clock.now)
        return True

    def _went_around(self, level: int, server: int) -> bool:
        """As ``Engine``'s ``went_around``: a neighbour's greeting says its plan goes around
        ``level``'s switch; this worker's does too."""
        return self._plan_around({level}, f"gone around by server {self.plan.home_of(server)}"
                                 ": it, or a link to it, is down")

    # Handshakes: a dial's SYN, the SYN-ACK or RST back (``Network.handshake``); a lost one
    # is not answered, and the dial is given up after DIAL_WAIT, as the engine's socket is.
    def _dial(self, key: PeerKey, via: int) -> None:
        dim, server = key
        home = self.plan.home_of(server)
        route = self.network.route(self.home, home, dim, detour=via != dim)
        connection = self.world.new_connection_id()
        self.dialing[key] = (connection, route)
        self.network.handshake(route, self.world.workers[home]._syn, self.home, connection,
                               route)

    def _syn(self, dialer: int, connection: int, route: list[tuple[int, int]]) -> None:
        """A neighbour's dial arrives: accepted while this worker makes its mesh (its
        listeners are open then), else refused by the kernel (a RST)."""
        back = route[::-1]
        other = self.world.workers[dialer]
        if self.state is State.CONNECTING and self.connector is not None:
            self.accepted[connection] = _Accepted(dialer, route[-1][1], back)
            answer = other._dial_answered
        else:
            answer = other._dial_refused
        self.network.handshake(back, answer, connection, route)

    def _dial_of(self, connection: int) -> PeerKey | None:
        return next((key for key, (c, _r) in self.dialing.items() if c == connection), None)

    def _dial_answered(self, connection: int, route: list[tuple[int, int]]) -> None:
        """The dial's SYN-ACK: greet (a HELLO), or close it if the connector gave it up."""
        key = self._dial_of(connection)
        connector = self.connector
        if key is None or connector is None or self.state is not State.CONNECTING:
            self._reset(route, connection)  # a socket closed since: its kernel resets it
            return
        if connector.dial_connected(key, self.clock.now):
            self._unadopted(route, connection, hello_message(connector.hello(key)))
        else:
            del self.dialing[key]
            self._reset(route, connection)
        self._connect_step()

    def _unadopted(self, route: list[tuple[int, int]], connection: int, message: bytes = b"",
                   closing: bool = False) -> None:
        """A greeting, or a close, on a connection not adopted here (not paced: nothing else
        goes on it yet)."""
        other = self.world.workers[route[-1][0]]
        _plan, _wanted, _windows, min_rto = self._mesh()
        self.network.send_stream(route, max(len(message), 1), lambda: other._arrived(
            self.home, message, connection, closing), min_rto)

    def _answered(self, key: PeerKey, answer: dict) -> None:
        """The acceptor's answer to this worker's HELLO (``MeshConnector.answered``)."""
        connector = self.connector
        now = self.clock.now
        connection, route = self.dialing[key]
        verdict = connector.answered(key, answer, now)
        if verdict is Verdict.DETOUR:
            if not self._went_around(*key):
                return
            verdict = connector.answered(key, answer, now)
        self.dialing.pop(key, None)
        if verdict is Verdict.ADOPT:
            home = self.plan.home_of(key[1])
            self.linked[home], self.routes[home] = connection, route
            self._maybe_connected()
        else:
            self._reset(route, connection)
        self._connect_step()

    def _dial_refused(self, connection: int, _route: list[tuple[int, int]]) -> None:
        key = self._dial_of(connection)
        if key is not None and self.connector is not None:
            del self.dialing[key]
            self.connector.dial_failed(key, self.clock.now)
            self._connect_step()

    def _reset(self, route: list[tuple[int, int]], connection: int) -> None:
        """This end closes a connection the other end may hold (a RST)."""
        self.network.handshake(route, self.world.workers[route[-1][0]]._was_reset, self.home,
                               connection)

    def _was_reset(self, sender: int, connection: int) -> None:
        if self.accepted.pop(connection, None) is None and self.linked.get(sender) == connection:
            self._arrived(sender, b"", connection, True)  # one it had adopted: closed

    def _judge(self, connection: int, hello: dict) -> None:
        """An accepted connection's HELLO: answered, and adopted or closed
        (``MeshConnector.accepted``)."""
        accepted = self.accepted.pop(connection)
        verdict, key, answer = self.connector.accepted(hello, accepted.via)
        if verdict is Verdict.DETOUR:
            if not self._went_around(*key):
                self._unadopted(accepted.route, connection, closing=True)
                return
            verdict, key, answer = self.connector.accepted(hello, accepted.via)
        if answer is not None:
            self._unadopted(accepted.route, connection, hello_message(answer))
        if verdict is not Verdict.ADOPT:
            self._unadopted(accepted.route, connection, closing=True)
            return
        home = self.plan.home_of(key[1])
        self.linked[home], self.routes[home] = connection, accepted.route
        self._maybe_connected()

    def _maybe_connected(self) -> None:
        if self.state is State.CONNECTING and self.connector is not None \
                and self.connector.done:
            self._stop_connecting()
            self.state = State.CALLING
            self._start_call()

    def _stop_connecting(self) -> None:
        """As ``Mesh.establish`` ends: the accepted connections not adopted and the dials
        under way are closed."""
        for connection, accepted in self.accepted.items():
            self._unadopted(accepted.route, connection, closing=True)
        for connection, route in self.dialing.values():
            self._reset(route, connection)
        self.accepted.clear()
        self.dialing.clear()
        self.connector = self.check = None

    def close_mesh(self) -> None:
        """Every connection of this worker closes; each neighbour learns it after what was
        sent on it before."""
        self._stop_connecting()
        for home, connection in list(self.linked.items()):
            self._stream(home, b"", connection, closing=True)
        self.linked.clear()

    def _stream(self, home: int, message: bytes, connection: int,
                closing: bool = False) -> None:
        other = self.world.workers[home]
        # Set and paced as hosts.mesh sets and paces its sockets (``_mesh``).
        _plan, _wanted, windows, min_rto = self._mesh()
        window = windows[home] if home in windows else connection_limit(
            stream_budgets(self.plan.schedule, self.plan.server)[self.plan.detours().get(0, 0)],
            self.plan.topology.n)
        self.network.send_stream(self.routes[home], max(len(message), 1),
                                 lambda: other._arrived(self.home, message, connection, closing),
                                 min_rto, window)

    def _queued(self, key: PeerKey) -> bool:
        route = self.routes.get(self.plan.home_of(key[1]))
        return route is not None and self.network.queued(route)

    def _arrived(self, sender: int, message: bytes, connection: int, closing: bool) -> None:
        if self.state in (State.DEAD, State.FAILED):
            return  # a process that is gone
        if connection in self.accepted:  # accepted, not judged yet: its HELLO
            if closing:
                del self.accepted[connection]
            else:
                self._judge(connection, hello_of(message))
            return
        key = self._dial_of(connection)
        if key is not None and self.connector is not None and self.connector.greeting(key):
            if closing:  # refused without an answer
                self.dialing.pop(key)
                self.connector.dial_failed(key, self.clock.now)
                self._connect_step()
            else:
                self._answered(key, hello_of(message))
            return
        if self.linked.get(sender) != connection:
            return  # a connection that was replaced, or one not adopted
        if closing:
            del self.linked[sender]
            self.closed.add(sender)
        else:
            self.inbox.setdefault(sender, deque()).append(decode_message(message))
        self._deliver(sender)

    def _deliver(self, sender: int) -> None:
        """Give the call this peer's messages of its tag, in order; keep those of the next
        call; drop late ones of the last (as ``hosts.mesh.Peer.messages``)."""
        call = self.call
        if self.state is State.FROZEN or call is None or call.finished:
            return
        key = self.wanted().get(sender)
        if key is None:
            return
        inbox = self.inbox.get(sender)
        now = self.clock.now
        while inbox:
            kind, tag, stripe, step, start, count, payload = inbox[0]
            if tag == (call.tag + 1) & 0xFF:
                break
            inbox.popleft()
            if tag == call.tag:
                call.on_message(now, key, kind, stripe, step, start, count, payload)
        if sender in self.closed and not inbox:
            call.on_closed(now, key)
        self._pump()

    # --- frames --------------------------------------------------------------------------
    def on_frame(self, level: int, payload: bytes) -> None:
        if self.state is State.CALLING and self.call is not None:
            self.call.on_frame(self.clock.now, level, payload)
            self._pump()
        elif (self.state is State.CONNECTING and self.check is not None
              and len(payload) >= HEADER_BYTES and payload[0] == PacketType.GENERATION):
            self.check.answered(level)

    # --- calls ---------------------------------------------------------------------------
    def push(self, flat: np.ndarray) -> None:
        """Start an allreduce of ``flat`` (the mesh first if it is not up)."""
        self.flat = flat
        self.outcome = None
        self.replans = []
        self.call_started = self.clock.now
        failure, self.aftermath = self.aftermath, None
        plan = self.plan.after(failure)
        if plan != self.plan:
            self.plan = plan
            self.close_mesh()
        if self.linked and set(self.linked) >= set(self.wanted()) and not self.closed:
            self.state = State.CALLING
            self._start_call()
        else:
            self.connect()

    def _start_call(self) -> None:
        self.calls += 1
        generation, self.generation = self.generation, None
        self.call = Call(self.plan, self.nics, self.flat, self.calls, generation,
                         self.clock.now, self.window, self.timeout, self.start_timeout,
                         self.network.wire, queued=self._queued)
        self.timer_at = float("inf")
        for home in list(self.inbox) + [h for h in self.closed if h not in self.inbox]:
            self._deliver(home)
        self._pump()

    def _pump(self) -> None:
        """Send what the call asks, then act on how it ended, or set its timer."""
        call = self.call
        if call is None or self.state is not State.CALLING:
            return
        frames = call.take_frames()
        for level, frame in frames:
            self.network.send_frame(self.home, level, job_udp_port(self.plan.job), frame)
        if frames:
            call.on_sent(self.clock.now)
        for (_dim, server), message in call.take_messages():
            home = self.plan.home_of(server)
            connection = self.linked.get(home)
            if connection is not None:
                self._stream(home, message, connection)
        if call.error is not None:
            self._failed(call)
        elif call.result is not None:
            stats = call.stats
            self.generation = call.generation
            if call.adopted:
                self.plan = self.plan.adopting(call.adopted)
            failure = self.aftermath = call.failed_after_result
            if failure is not None:
                self._abort(abort_messages(call.tag, str(failure),
                                           getattr(failure, "broken", None),
                                           getattr(failure, "lost", None), summed=True))
            if self.replans:
                self.replans[-1].resumed_at = stats.first_result
            stats.replans = self.replans
            self.state = State.IDLE
            self._end(result=call.result, stats=stats)
        else:
            wake = call.next_wake()
            if wake < self.timer_at:
                self.timer_at = wake
                self.clock.at(wake, self._timer, call)

    def _timer(self, call: Call) -> None:
        if call is not self.call or self.state is not State.CALLING:
            return
        if self.clock.now < call.next_wake():
            self.timer_at = call.next_wake()
            self.clock.at(self.timer_at, self._timer, call)
            return
        self.timer_at = float("inf")
        call.on_timer(self.clock.now)
        self._pump()

    def _abort(self, messages: tuple[bytes, ...]) -> None:
        """As ``Mesh.abort``: ``abort_messages`` to every neighbour, one write each."""
        for outgoing in messages:
            for home, connection in self.linked.items():
                self._stream(home, outgoing, connection)

    def _failed(self, call: Call) -> None:
        """As ``Engine.allreduce``: tell the neighbours, then re-plan, shrink or stop."""
        error = call.error
        broken = error.broken if isinstance(error, PartFailed) else None
        lost = error.lost if isinstance(error, WorkerLost) else None
        self._abort(abort_messages(call.tag, str(error), broken, lost))
        try:
            if isinstance(error, PartFailed):
                plan = self.plan.replanned(error)
            elif isinstance(error, WorkerLost):
                plan = self.plan.shrunk(error)
            else:
                raise TransportError(str(error))
        except TransportError as exc:
            self._end(error=str(exc))
            return
        self.replans.append(Replan(str(error), plan.schedule.describe(), self.clock.now))
        self.plan = plan
        for nic in self.nics:
            nic.restart()
        self.state = State.CONNECTING
        self.call = None
        self.clock.after(CLOSE_DELAY, self._reconnect)

    def _reconnect(self) -> None:
        if self.state is State.CONNECTING:
            self.connect()

    def _end(self, result: np.ndarray | None = None, error: str | None = None,
             stats: CallStats | None = None) -> None:
        if error is not None:
            self.state = State.FAILED
            self.close_mesh()
            self.call = None
        self.outcome = Outcome(result, error, self.clock.now, stats, list(self.replans))
        if self.on_end is not None:
            self.on_end(self)

    # --- faults --------------------------------------------------------------------------
    def kill(self) -> None:
        """The process dies: the kernel closes its connections (the neighbours see a FIN)."""
        self.close_mesh()
        self.state = State.DEAD
        self.call = None

    def freeze(self) -> None:
        """The process stops running (SIGSTOP): its connections stay open and silent."""
        if self.state is State.CALLING:
            self.state = State.FROZEN


class WorkerWorld:
    """What workers need of the world they run in (``simulation.world`` provides it)."""

    clock: Clock
    network: Network
    workers: dict[int, SimWorker]

    def new_connection_id(self) -> int:
        raise NotImplementedError

