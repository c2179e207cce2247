"""The mesh's connect phase without I/O (``hosts.connector``): who dials whom over which NIC,
what each end's greeting makes the other plan, and which switches are planned around while
the mesh is made. Virtual times; the sockets' side is tests/test_mesh.py's, the simulated
network's tests/test_sim.py's."""

from __future__ import annotations

from bml.topology import Topology
from hosts.connector import DIAL_WAIT, MeshConnector, MeshSwitchCheck, Verdict
from hosts.recovery import CONNECT_QUESTION_WAIT, START_DEADLINE, NicState

BCUBE = Topology.parse("bcube:2,2")  # level 0: {0, 1}, {2, 3}; level 1: {0, 2}, {1, 3}


def connector(server: int, detours: dict[int, int] | None = None,
              now: float = 0.0) -> MeshConnector:
    return MeshConnector(7, server, BCUBE, detours or {}, 10.0, now)


def test_the_lower_numbered_server_dials_and_the_acceptors_answer_makes_the_connection():
    """HELLO, then the answer: the acceptor's connection is made as it answers, the
    dialler's by the answer."""
    zero, two = connector(0), connector(2)
    assert zero.dials(0.0) == [((0, 1), 0), ((1, 2), 1)]
    assert two.dials(0.0) == [((0, 3), 0)]  # not server 0: it dials server 2
    assert zero.dial_connected((1, 2), 0.01)
    hello = zero.hello((1, 2))
    assert hello == {"job": 7, "server": 0, "dim": 1, "detour": False}
    verdict, key, answer = two.accepted(hello, via=1)
    assert (verdict, key) == (Verdict.ADOPT, (1, 0)) and answer["kept"]
    assert zero.answered((1, 2), answer, 0.02) is Verdict.ADOPT
    assert (1, 2) in zero.connected and (1, 0) in two.connected


def test_a_direct_dial_without_an_answer_is_followed_by_a_guess_over_the_detour():
    """Server 2's link to the level-1 switch is down: only server 2 sees it. Server 0's
    direct dial goes unanswered; its next dial goes over the detour (level 0), unplanned.
    Server 2 keeps it once its own plan goes around the switch, and says so: server 0
    plans the detour too."""
    zero = connector(0)
    zero.dials(0.0)
    assert zero.stale_dials(DIAL_WAIT - 0.01) == []
    assert (1, 2) in zero.stale_dials(DIAL_WAIT)
    assert ((1, 2), 0) in zero.dials(DIAL_WAIT)  # the guess
    zero.dial_connected((1, 2), DIAL_WAIT)
    hello = zero.hello((1, 2))
    assert not hello["detour"]
    # Server 2 has not planned it (yet): a guess it has no reason for is closed, unanswered.
    assert connector(2).accepted(hello, via=0)[0] is Verdict.REFUSE
    zero.dial_failed((1, 2), DIAL_WAIT + 0.01)
    assert ((1, 2), 1) in zero.dials(DIAL_WAIT + 0.1)  # the direct way again
    # Once server 2 goes around it, it keeps the guess and says so.
    assert (1, 2) in zero.stale_dials(2 * DIAL_WAIT + 0.1)
    assert ((1, 2), 0) in zero.dials(2 * DIAL_WAIT + 0.1)
    zero.dial_connected((1, 2), 2 * DIAL_WAIT + 0.11)
    verdict, _key, answer = connector(2, {1: 0}).accepted(zero.hello((1, 2)), via=0)
    assert verdict is Verdict.ADOPT and answer == {"job": 7, "server": 2, "dim": 1,
                                                   "detour": True, "kept": True}
    assert zero.answered((1, 2), answer, 2.2) is Verdict.DETOUR  # plan it, then again
    zero.replanned({1: 0}, 2.2)
    assert zero.answered((1, 2), answer, 2.2) is Verdict.ADOPT


def test_a_dialler_that_planned_a_detour_makes_the_acceptor_plan_it_too():
    zero, two = connector(0, {1: 0}), connector(2)
    assert ((1, 2), 0) in zero.dials(0.0)
    zero.dial_connected((1, 2), 0.01)
    hello = zero.hello((1, 2))
    assert hello["detour"]
    assert two.accepted(hello, via=0)[0] is Verdict.DETOUR
    two.replanned({1: 0}, 0.02)
    verdict, key, answer = two.accepted(hello, via=0)
    assert (verdict, key) == (Verdict.ADOPT, (1, 0)) and answer["detour"]
    assert zero.answered((1, 2), answer, 0.03) is Verdict.ADOPT


def test_an_acceptor_that_planned_a_detour_turns_a_direct_dial_around():
    zero, two = connector(0), connector(2, {1: 0})
    zero.dials(0.0)
    zero.dial_connected((1, 2), 0.01)
    verdict, _key, answer = two.accepted(zero.hello((1, 2)), via=1)
    assert verdict is Verdict.REFUSE and answer == {"job": 7, "server": 2, "dim": 1,
                                                    "detour": True, "kept": False}
    assert zero.answered((1, 2), answer, 0.02) is Verdict.DETOUR
    zero.replanned({1: 0}, 0.02)
    assert zero.answered((1, 2), answer, 0.02) is Verdict.REFUSE  # closed: dial again
    assert ((1, 2), 0) in zero.dials(0.02)  # over the detour at once


def test_greetings_that_are_not_a_neighbours_are_refused_without_an_answer():
    """Forged or stray HELLOs are closed unanswered; a neighbour's second one replaces its
    first."""
    two = connector(2)
    hello = {"job": 7, "server": 0, "dim": 1, "detour": False}
    for forged in ({}, {**hello, "job": 8}, {**hello, "server": 3}, {**hello, "dim": [1]},
                   {**hello, "server": "0"}):
        verdict, _key, answer = two.accepted(forged, via=1)
        assert verdict is Verdict.REFUSE and answer is None
    assert two.accepted(hello, via=1)[0] is Verdict.ADOPT
    assert two.accepted(hello, via=1)[0] is Verdict.ADOPT  # dialled again: it replaces
    assert connector(2).accepted(hello, via=0)[0] is Verdict.REFUSE  # neither path


def test_the_switches_are_asked_round_after_round_while_neighbours_are_missing():
    """A switch that answered as the mesh began and died since (its neighbours' greetings
    stuck behind it) is found a round later, not at the mesh's deadline."""
    nics = [NicState(0, "10.0.0.254"), NicState(1, "10.0.1.254")]
    check = MeshSwitchCheck({0, 1}, nics, 0.0, early=True)
    assert check.due(0.0) == [0, 1]  # at once
    check.answered(0)
    check.answered(1)
    assert check.poll(0.01, {0, 1}, expired=False) == set()  # everyone answered
    assert check.poll(0.02, {0}, expired=False) == set()  # level 0 still missing: asked again
    assert check.due(0.02) == [0]
    assert check.poll(0.02 + START_DEADLINE, {0}, expired=False) == {0}  # dead since
    check.replanned({1}, 3.1)
    assert check.due(3.1) == [1]


def test_the_mesh_fails_at_its_deadline_only_after_the_switches_were_asked_again():
    nics = [NicState(0, "10.0.0.254"), NicState(1, "10.0.1.254")]
    check = MeshSwitchCheck({0, 1}, nics, 0.0, early=False)  # no time for early rounds
    assert check.due(0.0) == [] and check.poll(5.0, {1}, expired=False) == set()
    assert check.asking  # the mesh does not fail before its last round
    assert check.poll(10.0, {1}, expired=True) == set()  # the deadline: asked
    assert check.due(10.0) == [1]
    check.answered(1)
    assert check.poll(10.1, {1}, expired=True) == set()
    assert not check.asking  # the switch answers: the neighbour is missing, the mesh fails
    check = MeshSwitchCheck({0, 1}, nics, 0.0, early=False)
    check.poll(10.0, {1}, expired=True)
    assert check.poll(10.0 + CONNECT_QUESTION_WAIT, {1}, expired=True) == {1}  # silent


def test_a_switch_silent_at_the_mesh_start_is_planned_around_and_the_rest_asked_again():
    nics = [NicState(0, "10.0.0.254"), NicState(1, "10.0.1.254")]
    check = MeshSwitchCheck({0, 1}, nics, 0.0, early=True)
    check.due(0.0)
    check.answered(0)
    assert check.poll(START_DEADLINE - 0.01, {0, 1}, expired=False) == set()
    assert check.poll(START_DEADLINE, {0, 1}, expired=False) == {1}
    check.replanned({0}, START_DEADLINE)
    assert check.asking and check.due(START_DEADLINE) == [0]
