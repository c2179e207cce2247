"""Workers in virtual time: the real ``hosts.call.Call`` and ``hosts.membership.Membership``,
driven the way ``hosts.engine.Engine`` drives them, over the simulated network.

What the engine does with sockets happens here with ``simulation.network``: frames go to
``Network.send_frame``, mesh messages down a reliable stream along the connection's route
(direct, or over relays where the schedule has the level broken), and what arrives is given
to the call with the virtual time. The mesh's connections are modelled as TCP's are used:
a connection joins two workers while both are connecting (a new membership, or the start);
closing one (a worker that re-plans, stops or dies) reaches the other end after everything
sent before it, as a FIN does; messages of a connection that was replaced are dropped.
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
from hosts.errors import TransportError
from hosts.membership import Membership, PartFailed, PeerKey, WorkerLost
from hosts.mesh import CONTROL_RTO_MIN_US, abort_messages, decode_message
from hosts.recovery import (
    CONNECT_QUESTION_WAIT,
    START_DEADLINE,
    NicState,
    SwitchQuestions,
    question_wait,
)
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
        self.mesh_id = 0
        self.linked: dict[int, tuple[int, ...]] = {}  # peer's home -> connection id
        self.inbox: dict[int, deque] = {}  # peer's home -> messages not yet given to a call
        self.closed: set[int] = set()  # peers' homes whose connection closed
        self.call: Call | None = None
        self.flat: np.ndarray | None = None
        self.outcome: Outcome | None = None
        self.replans: list[Replan] = []
        self.call_started = 0.0
        self.connect_deadline = 0.0
        self.questions: SwitchQuestions | None = None  # to the switches, while connecting
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

    def connect(self, keep: bool = False) -> None:
        """Open the mesh (again): every neighbour that is connecting too, and that a working
        path reaches, joins now, the others when they come, within ``start_timeout``.
        ``keep``: the connections made stay (the mesh goes on after a re-planning)."""
        self.state = State.CONNECTING
        if not keep:
            self.mesh_id = self.world.new_mesh_id()  # unique: a process's connections are new
            self.calls = 0
            self.linked.clear()
            self.inbox.clear()
            self.closed.clear()
        self.connect_deadline = self.clock.now + self.start_timeout
        self.clock.at(self.connect_deadline, self._connect_timeout, self.connect_deadline)
        self.questions = None
        if not keep and self.start_timeout > START_DEADLINE:  # ``Engine._connect``'s check
            self._ask(set(self.plan.live_levels()), START_DEADLINE, final=False)
        for home in self.wanted():
            other = self.world.workers[home]
            if other.state is State.CONNECTING and self.home in other.wanted() \
                    and self.home not in other.linked and home not in self.linked \
                    and other._route(self.home) == self._route(home)[::-1] \
                    and self.network.path_up(self._route(home)):
                ends = sorted(((self.home, self.mesh_id), (home, other.mesh_id)))
                connection = (*ends[0], *ends[1])
                self.linked[home] = connection
                other.linked[self.home] = connection
                self.routes[home] = self._route(home)
                other.routes[self.home] = other._route(self.home)
                other._maybe_connected()
        self._maybe_connected()

    def _maybe_connected(self) -> None:
        if self.state is State.CONNECTING and set(self.linked) >= set(self.wanted()):
            self.state = State.CALLING
            self._start_call()

    def _missing_levels(self) -> set[int]:
        """The levels on which neighbours have not connected yet."""
        wanted = self.wanted()
        return {wanted[home][0] for home in set(wanted) - set(self.linked)}

    def _ask(self, levels: set[int], least_wait: float, final: bool) -> None:
        """A round of questions to the switches of ``levels``, through the network to their
        pipelines (``hosts.recovery.SwitchQuestions``, as the engine asks them)."""
        questions = SwitchQuestions(levels, self.clock.now,
                                    question_wait(self.nics, levels, least_wait))
        self.questions = questions
        self._question_round(questions, self.connect_deadline, final)

    def _question_round(self, questions: SwitchQuestions, deadline: float, final: bool) -> None:
        if self.questions is not questions or self.state is not State.CONNECTING \
                or self.connect_deadline != deadline:
            return  # connected, or another round or mesh since
        now = self.clock.now
        plan = self.plan
        me = plan.topology.digits(plan.server)
        for level in questions.due(now):
            self.network.send_frame(self.home, level, job_udp_port(plan.job),
                                    generation_question(plan.probe_job(), me[level],
                                                        self.network.wire))
        if not questions.over(now):
            self.clock.at(questions.next_due(), self._question_round, questions, deadline, final)
            return
        self.questions = None
        if self._plan_around(questions.silent & self._missing_levels()):
            if not final and self.state is State.CONNECTING:  # as the engine: a new round
                self._ask(set(self.plan.live_levels()), START_DEADLINE, final=False)
            return
        if final:
            missing = sorted(set(self.wanted()) - set(self.linked))
            self._end(error=f"job {self.plan.job} server {self.home}: no connection within "
                      f"{self.start_timeout:g} s to server(s) {', '.join(map(str, missing))}: "
                      "are all the job's workers running?")

    def _connect_timeout(self, deadline: float) -> None:
        """As ``Engine._connect`` at the start timeout: the switches of the levels still
        missing neighbours are asked; a silent one is planned around, else the push fails."""
        if self.state is not State.CONNECTING or self.connect_deadline != deadline:
            return
        self._ask(self._missing_levels() & set(self.plan.live_levels()),
                  CONNECT_QUESTION_WAIT, final=True)

    def _plan_around(self, silent_levels: set[int]) -> bool:
        """As ``Engine.replan_around``: re-plan around the switches of ``silent_levels`` and
        connect over their detours; False if there are none."""
        plan = self.plan
        silent = {(level, plan.topology.switch_index(plan.server, level))
                  for level in silent_levels & set(plan.live_levels())}
        if not silent:
            return False
        cause = (f"job {self.plan.job} server {self.home}: a switch did not answer while "
                 "the mesh was made: down or cut off")
        try:
            self.plan = self.plan.replanned(PartFailed(cause, silent))
        except TransportError as exc:
            self._end(error=str(exc))
            return True
        self.replans.append(Replan(cause, self.plan.schedule.describe(), self.clock.now))
        self.connect(keep=True)
        return True

    def close_mesh(self) -> None:
        """Every connection of this worker closes; each neighbour learns it after what was
        sent on it before."""
        for home, connection in list(self.linked.items()):
            self._stream(home, b"", connection, closing=True)
        self.linked.clear()

    def _route(self, home: int) -> list[tuple[int, int]]:
        key = self.wanted().get(home)
        dim = key[0] if key is not None else 0
        whole = self.plan.whole
        detour = whole.k > 1 and self.plan.schedule.is_broken(self.plan.server, dim)
        return self.network.route(self.home, home, dim, detour)

    def _stream(self, home: int, message: bytes, connection: tuple[int, ...],
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

    def _arrived(self, sender: int, message: bytes, connection: tuple[int, ...],
                 closing: bool) -> None:
        if self.state in (State.DEAD, State.FAILED) or self.linked.get(sender) != connection:
            return  # a connection that was replaced or a process that is gone
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
        elif (self.state is State.CONNECTING and self.questions is not None
              and len(payload) >= HEADER_BYTES and payload[0] == PacketType.GENERATION):
            self.questions.answered(level)

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
            self.close_mesh()
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

    def new_mesh_id(self) -> int:
        raise NotImplementedError

