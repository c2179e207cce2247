"""The switch watch (``hosts.recovery.switch_down``), without I/O: when a silent switch is
taken for dead, and how patient it is while a NIC's first windows queue; and the questions
asked while the mesh is made (``SwitchQuestions``)."""

from __future__ import annotations

from hosts.recovery import (
    FIRST_ANSWER_DEADLINE,
    QUIET_NIC_DEADLINE,
    START_DEADLINE,
    SWITCH_SILENCE,
    NicState,
    SwitchQuestions,
    switch_down,
    watch_bounds,
)


def declared_down_after(nic: NicState, start: float, step: float = 0.01, **kwargs) -> float:
    """Seconds of silence from ``start`` until the watch takes the switch for dead; the
    questions it asks are counted on the NIC."""
    now = start
    while not switch_down(nic, now, lambda: None, **kwargs):
        now += step
        assert now - start < 60, "never declared down"
    return now - start


def test_a_dead_switch_is_found_within_its_bounds_and_in_the_exchange_later():
    quiet = NicState(0, "10.1.255.1")
    assert declared_down_after(quiet, 0.0, awaiting=False) <= \
        SWITCH_SILENCE + QUIET_NIC_DEADLINE + 0.02
    assert quiet.questions == 4
    starting = NicState(0, "10.1.255.1")
    found = declared_down_after(starting, 0.0, awaiting=False, starting=True)
    assert SWITCH_SILENCE + START_DEADLINE <= found <= SWITCH_SILENCE + START_DEADLINE + 0.02


def answered(nic: NicState, answers: int, seconds: float = 0.005) -> None:
    for _ in range(answers):
        nic.rto.sample(seconds)
        nic.answered()


def test_a_fresh_nic_is_patient_until_its_first_window_is_answered_not_its_first_answer():
    """The first answers come through an empty queue; the rest of every member's first
    window then queues in the switch, and a quick first answer time must not make the watch
    take the queue for a dead switch."""
    nic = NicState(0, "10.1.255.1")
    nic.expect(256)
    answered(nic, 25)
    assert watch_bounds(nic, awaiting=True) == (SWITCH_SILENCE, FIRST_ANSWER_DEADLINE)
    answered(nic, 231)
    assert watch_bounds(nic, awaiting=True) == (SWITCH_SILENCE, 0.5)
    nic.restart()  # a new plan: its first windows are every member's burst again
    nic.expect(128)
    answered(nic, 127)
    assert watch_bounds(nic, awaiting=True) == (SWITCH_SILENCE, FIRST_ANSWER_DEADLINE)
    answered(nic, 1)
    assert watch_bounds(nic, awaiting=True) == (SWITCH_SILENCE, 0.5)


def test_the_switches_are_asked_at_once_and_a_silent_one_is_named_once_the_wait_is_over():
    """As a worker's mesh begins: every switch asked at once, the silent ones again every
    quarter of the wait; those still silent when it ends are down."""
    questions = SwitchQuestions({0, 1}, 10.0, START_DEADLINE)
    assert questions.due(10.0) == [0, 1]
    assert questions.due(10.1) == []  # not again before a quarter of the wait
    questions.answered(0)
    assert questions.due(10.0 + START_DEADLINE / 4) == [1]
    assert not questions.over(10.0 + START_DEADLINE - 0.01)
    assert questions.over(10.0 + START_DEADLINE) and questions.silent == {1}
    everyone = SwitchQuestions({0, 1}, 0.0, START_DEADLINE)
    everyone.answered(0)
    everyone.answered(1)
    assert everyone.over(0.1) and not everyone.silent  # no need to wait the rest out
