"""How a worker's mesh gets connected, without I/O: which neighbours it dials, over which
NIC and when, and whether a connection is kept.

The lower-numbered server of a pair dials; the other accepts. They greet each other: the
dialler's HELLO (job, server, level, and whether its plan goes around that level's switch),
then the acceptor's answer, which says whether it keeps the connection and whether its own
plan goes around the level. A level whose switch, or one member's link to it, is down is
reached over its detour (another level's NICs, through relay servers), and each end plans
that detour on its own evidence: its switch silent (``MeshSwitchCheck``). The greeting makes
the two plans agree:

* a dialler that planned the detour dials over it, and the acceptor plans it too;
* an acceptor that planned it answers a dial that came the direct way with "go around", and
  the dialler plans it and dials again over the detour;
* a dialler whose direct dial got no answer (a neighbour's link to the switch down, seen
  only by that neighbour) tries the detour next, unplanned: the acceptor keeps it only if
  its own plan goes around the level (and says so: the dialler then plans it), else closes
  it, and the dialler tries the direct way again.

Dials do not block: each waits ``DIAL_WAIT`` beside everything else. Only the acceptor's
answer adopts a connection at the dialler; one that waited ``GREETING_WAIT`` for it dials
again, and the acceptor replaces the first connection with the second.

``hosts.mesh.Mesh.establish`` does what this decides with sockets; the simulator
(``simulation.workers``) does it over its network, so the deterministic simulator runs the
same rules as the engine.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from bml.topology import Topology
from hosts.recovery import (
    CONNECT_QUESTION_WAIT,
    START_DEADLINE,
    NicState,
    SwitchQuestions,
    question_wait,
)

PeerKey = tuple[int, int]  # (level, neighbour's server)

DIAL_WAIT = 1.0  # s a dial waits for the other end's kernel before it is given up
# s a connected dial waits for the acceptor's answer: longer, since an acceptor that kept the
# connection counts it as made (a switch that dies between the handshake and the HELLO
# holds the HELLO; a previous call's frames may fill the queues on the way).
GREETING_WAIT = 3 * DIAL_WAIT
DIAL_RETRY = 0.05  # s after a dial the other end refused or closed


class Verdict(enum.Enum):
    """What to do with a connection once a greeting is read."""

    ADOPT = "adopt"  # keep it (an acceptor sends ``answer`` first)
    REFUSE = "refuse"  # close it (an acceptor sends nothing; ``answer`` may say go around)
    DETOUR = "detour"  # plan around the level first (the other end has), then ask again


@dataclass
class _Dial:
    via: int  # the NIC level it goes over
    since: float
    guess: bool  # over the detour the plan does not have (the direct way went unanswered)
    greeting: bool = False  # connected, HELLO sent, waiting for the answer (since ``since``)

    @property
    def wait(self) -> float:
        return GREETING_WAIT if self.greeting else DIAL_WAIT


class MeshConnector:
    """The connect phase of one worker's mesh, driven by its caller with ``now``.

    Dialler's side: ``dials(now)`` gives the connects to start; ``dial_failed`` (refused,
    closed, no answer to the greeting), ``dial_connected`` (send ``hello(key)`` if True), and
    ``answered`` with the acceptor's answer; ``stale_dials`` says which to give up.
    Acceptor's side: ``accepted`` for every HELLO read on the listeners (send ``answer`` if
    it says to). ``replanned`` takes new detours; the mesh fails once ``expired``
    (``error``)."""

    def __init__(self, job: int, server: int, topology: Topology, detours: dict[int, int],
                 timeout: float, now: float, connected: Iterable[PeerKey] = ()) -> None:
        self.job, self.server, self.topology, self.timeout = job, server, topology, timeout
        self.detours = dict(detours)
        self.expected: set[PeerKey] = {(dim, s) for dim in range(topology.k)
                                       for s in topology.neighbours(server, dim)}
        self.to_dial = sorted(key for key in self.expected if key[1] > server)
        self.connected: set[PeerKey] = set(connected)
        self.dialing: dict[PeerKey, _Dial] = {}
        self.next_try: dict[PeerKey, float] = dict.fromkeys(self.to_dial, now)
        self.unanswered: set[PeerKey] = set()  # the last direct dial got no answer
        self.deadline = now + timeout

    def via(self, dim: int) -> int:
        """The level whose NICs carry the connections of level ``dim`` (its detour's)."""
        return self.detours.get(dim, dim)

    def _detour_of(self, dim: int) -> int | None:
        return self.topology.detour_level(dim) if self.topology.k > 1 else None

    @property
    def done(self) -> bool:
        return self.connected >= self.expected

    def missing(self) -> list[PeerKey]:
        return sorted(self.expected - self.connected)

    def missing_levels(self) -> set[int]:
        return {dim for dim, _s in self.expected - self.connected}

    def expired(self, now: float) -> bool:
        return not self.done and now >= self.deadline

    def error(self) -> str:
        return (f"job {self.job} server {self.server}: no connection within {self.timeout:g} "
                "s to " + ", ".join(f"server {s} (level {d})" for d, s in self.missing())
                + ": are all the job's workers running?")

    def replanned(self, detours: dict[int, int], now: float) -> None:
        """New detours: the wait starts again and every dial not made is due at once (those
        under way over a NIC the plan has left are ``stale_dials``)."""
        self.detours = dict(detours)
        self.deadline = now + self.timeout
        self.next_try = dict.fromkeys(self.to_dial, now)

    # --- the dialler's side ----------------------------------------------------------------
    def dials(self, now: float) -> list[tuple[PeerKey, int]]:
        """(neighbour, NIC level) of each dial to start now; each is under way from now."""
        due = [key for key in self.to_dial if key not in self.connected
               and key not in self.dialing and self.next_try[key] <= now]
        for key in due:
            via, detour = self.via(key[0]), self._detour_of(key[0])
            guess = via == key[0] and key in self.unanswered and detour is not None
            self.unanswered.discard(key)
            self.dialing[key] = _Dial(detour if guess else via, now, guess)
        return [(key, self.dialing[key].via) for key in due]

    def hello(self, key: PeerKey) -> dict:
        """What the dialler says first on the connection to ``key``."""
        return {"job": self.job, "server": self.server, "dim": key[0],
                "detour": self.via(key[0]) != key[0]}

    def greeting(self, key: PeerKey) -> bool:
        """The dial to ``key`` connected and waits for the acceptor's answer."""
        dial = self.dialing.get(key)
        return dial is not None and dial.greeting

    def dial_failed(self, key: PeerKey, now: float) -> None:
        """The dial could not start, was refused or closed: tried again ``DIAL_RETRY``
        later."""
        if self.dialing.pop(key, None) is not None:
            self.next_try[key] = now + DIAL_RETRY

    def dial_connected(self, key: PeerKey, now: float) -> bool:
        """The dial's connect completed: True to send ``hello(key)`` and wait for the
        answer, False if the caller closes it (given up, or over a NIC the plan has since
        left: dialled again)."""
        dial = self.dialing.get(key)
        if dial is None or key in self.connected:
            self.dialing.pop(key, None)
            return False
        if not dial.guess and dial.via != self.via(key[0]):
            del self.dialing[key]
            self.next_try[key] = now
            return False
        dial.greeting, dial.since = True, now
        return True

    def answered(self, key: PeerKey, answer: dict, now: float) -> Verdict:
        """The acceptor's answer to the HELLO. ADOPT: the connection is made. DETOUR: the
        acceptor's plan goes around the level: the caller plans it too and asks again (the
        connection is kept if it came over the detour; else closed and dialled again over
        it). REFUSE: closed, dialled again."""
        dial = self.dialing.get(key)
        if dial is None or answer.get("job") != self.job or answer.get("dim") != key[0] \
                or answer.get("server") != key[1]:
            self.dial_failed(key, now)
            return Verdict.REFUSE
        if answer.get("detour") and self.via(key[0]) == key[0]:
            return Verdict.DETOUR
        del self.dialing[key]
        if not answer.get("kept"):
            self.next_try[key] = now if answer.get("detour") else now + DIAL_RETRY
            return Verdict.REFUSE
        self.connected.add(key)  # kept by the acceptor: made, even if the plan moved since
        return Verdict.ADOPT

    def stale_dials(self, now: float) -> list[PeerKey]:
        """Dials to give up now (the caller closes them): no answer from the other end's
        kernel within ``DIAL_WAIT``, or from the acceptor within ``GREETING_WAIT`` (a direct
        one: the detour is tried next), or over a NIC the plan has left. Each is dialled
        again at once."""
        stale = []
        for key, dial in self.dialing.items():
            if now >= dial.since + dial.wait:  # as next_wake computes it
                if dial.via == key[0]:
                    self.unanswered.add(key)
                stale.append(key)
            elif not dial.guess and not dial.greeting and dial.via != self.via(key[0]):
                stale.append(key)
        for key in stale:
            del self.dialing[key]
            self.next_try[key] = now
        return stale

    # --- the acceptor's side ---------------------------------------------------------------
    def accepted(self, hello: dict, via: int) -> tuple[Verdict, PeerKey, dict | None]:
        """What to do with a connection that came in on NIC level ``via`` and said ``hello``
        (empty: no valid HELLO), and the answer to send (None: close without one). ADOPT
        counts the neighbour as connected (a connection it already had is replaced: its
        dialler gave up waiting for the answer and dialled again). DETOUR: the dialler
        planned the level's detour: the caller plans it too and asks again."""
        dim, other = hello.get("dim"), hello.get("server")
        if type(dim) is not int or type(other) is not int:
            return Verdict.REFUSE, (-1, -1), None
        key = (dim, other)
        if hello.get("job") != self.job or key not in self.expected \
                or via not in (dim, self._detour_of(dim)):
            return Verdict.REFUSE, key, None
        around = self.via(dim) != dim
        answer = {"job": self.job, "server": self.server, "dim": dim, "detour": around,
                  "kept": True}
        if via != dim and not around:
            if hello.get("detour"):
                return Verdict.DETOUR, key, None
            return Verdict.REFUSE, key, None  # a guess this worker's plan gives no reason for
        if via == dim and around:
            return Verdict.REFUSE, key, {**answer, "kept": False}  # go around
        self.connected.add(key)
        return Verdict.ADOPT, key, answer

    def next_wake(self, now: float) -> float:
        """When something is due: a dial to start or give up, or the deadline (if to come)."""
        waits = [self.deadline] if self.deadline > now else [float("inf")]
        waits += [self.next_try[key] for key in self.to_dial
                  if key not in self.connected and key not in self.dialing]
        waits += [dial.since + dial.wait for dial in self.dialing.values()]
        return min(waits)


class MeshSwitchCheck:
    """While the mesh is made: which of the worker's switches to plan around. Rounds of
    questions go to the switches of the levels still missing neighbours, one after the
    other (``early``: when the start timeout leaves room for them), the first at once: a
    switch down before the processes start is planned around ``START_DEADLINE`` into the
    mesh (every worker process starting at once loads the switches too), and one that dies
    while the mesh is made a round or two later. When the mesh's wait has expired, a last
    round asks them (``CONNECT_QUESTION_WAIT`` at least: other workers may still drain a
    previous call's frames through them). A switch silent when its round ends, on a level
    that still misses neighbours, is to be planned around; the mesh fails only once the
    round at its expiry found none.

    Without I/O: the caller sends a GENERATION question to the switch of each level ``due``
    returns, reports answers (``answered``), calls ``poll`` and re-plans around what it
    returns, then calls ``replanned``. The engine (``hosts.engine``) asks on its NIC
    sockets, the simulator through its network."""

    def __init__(self, levels: set[int], nics: list[NicState], now: float,
                 early: bool) -> None:
        self.nics, self.early = nics, early
        self.round: SwitchQuestions | None = None
        self.final = False  # the round under way is the one at the mesh's expiry
        self.final_done = False  # it ended (the mesh fails unless re-planned)
        if early:
            self._start(levels, now, START_DEADLINE)

    def _start(self, levels: set[int], now: float, least_wait: float) -> None:
        self.round = SwitchQuestions(levels, now, question_wait(self.nics, levels, least_wait))

    @property
    def asking(self) -> bool:
        """A round is under way, or due (the mesh does not fail yet)."""
        return self.round is not None or not self.final_done

    def due(self, now: float) -> list[int]:
        """The levels whose switch to ask now."""
        return self.round.due(now) if self.round is not None else []

    def answered(self, level: int) -> None:
        if self.round is not None:
            self.round.answered(level)

    def next_due(self) -> float:
        return self.round.next_due() if self.round is not None else float("inf")

    def poll(self, now: float, missing: set[int], expired: bool) -> set[int]:
        """The levels to plan around now: silent when their round ended, and still missing
        neighbours (``missing``, of the levels the plan uses). ``expired``: the mesh's wait
        is over."""
        if self.round is None:
            if expired and not missing:  # nothing left to plan around: the mesh fails
                self.final_done = True
            if not missing:
                return set()
            if expired:
                if self.final_done:
                    return set()
                self.final = True
                self._start(missing, now, CONNECT_QUESTION_WAIT)
            elif self.early:
                self._start(missing, now, START_DEADLINE)
            else:
                return set()
        if not self.round.over(now):
            return set()
        silent, self.round = self.round.silent & missing, None
        self.final_done = self.final  # ``replanned`` starts the wait again
        return silent

    def replanned(self, levels: set[int], now: float) -> None:
        """Planned around what ``poll`` returned: the switches left are asked again at once
        (the mesh's wait starts again)."""
        self.final = self.final_done = False
        if self.early:
            self._start(levels, now, START_DEADLINE)
