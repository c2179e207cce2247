"""When a slot of a window is presumed lost (``hosts.recovery.SlotWindow.overdue``), without
I/O: the rules a call's tail depends on, timed against a known answer time."""

from __future__ import annotations

import pytest

from bml.protocol import PacketType, pack_header
from hosts.recovery import MID_CALL_STALL, NicState, SlotWindow
from hosts.stats import CallStats

ANSWER = 0.01  # every answer time the NIC has seen
TIMEOUT = 2 * ANSWER  # what the window's timeout then is (RTO_QUANTILES x the median)


class Window(SlotWindow):
    """A window whose frames are DATA headers naming their slot and sequence number."""

    def frame_of(self, slot: int, seq: int) -> bytes:
        return pack_header(PacketType.DATA, 1, 0, slot, offset=seq)


def window(uses: list[int], in_flight: int) -> tuple[Window, list[bytes]]:
    nic = NicState(0, "10.1.255.1")
    for _ in range(8):
        nic.rto.sample(ANSWER)
    assert nic.rto.value == pytest.approx(TIMEOUT)
    sent: list[bytes] = []
    slots = Window(nic, len(uses), uses, in_flight, 0.0, sent.append, CallStats())
    for slot in range(len(uses)):
        slots.launch(slot, 0.0)
    return slots, sent


def overdue_at(slots: Window, since: float) -> float:
    """Seconds from ``since`` until the window's only waiting slot is presumed lost."""
    now = since
    while not slots.overdue(now, slots.draining()):
        now += 0.0005
        assert now - since < 1.0
    return now - since


def test_a_slots_back_off_counts_recoveries_since_the_switch_last_answered_it():
    """Nothing answered: each recovery waits twice the one before (from the second). A MISSING
    shows the switch and the path alive: the re-sent frame, if lost too, waits one timeout
    again, not the back-off of the recoveries before it."""
    slots, sent = window([1], in_flight=8)
    waits = []
    now = 0.0
    for _ in range(3):
        wait = overdue_at(slots, now)
        waits.append(wait)
        now += wait
        slots.resend(0, now, "stalled")
    assert waits == pytest.approx([TIMEOUT, TIMEOUT, 2 * TIMEOUT], abs=0.001)
    assert [frame[0] for frame in sent] == [PacketType.DATA, PacketType.PROBE, PacketType.DATA,
                                            PacketType.PROBE]
    now += 0.001
    slots.on_missing(now, 0)  # the probe's answer: the frame went again
    assert sent[-1][0] == PacketType.DATA
    assert overdue_at(slots, now) == pytest.approx(TIMEOUT, abs=0.001)
    assert slots.retries[0] == 4  # (Karn's rule still knows the answer would be ambiguous)


def test_a_slot_left_behind_waits_one_timeout_not_a_mid_call_stall():
    """Slot 0 still has uses to send but every other slot has finished: none of the window's
    frames is queued ahead of its answer, so silence after one timeout presumes it lost, as
    at a window's end; with many frames in the queue a pause waits ``MID_CALL_STALL``."""
    slots, _ = window([3] + [1] * 3, in_flight=16)
    for slot in (1, 2, 3):
        slots.answered(0.005, slot)
    assert not slots.draining() and not slots.sends
    assert overdue_at(slots, 0.005) == pytest.approx(TIMEOUT, abs=0.001)

    busy, _ = window([2] * 12, in_flight=16)
    assert len(busy.sends) == 12
    assert not busy.overdue(MID_CALL_STALL * TIMEOUT - 0.001, False)
    assert len(busy.overdue(MID_CALL_STALL * TIMEOUT + 0.001, False)) == 12
