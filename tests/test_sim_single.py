"""One-NIC workers (``hosts.single.SingleSwitchCall``, the real code) in the simulator: the
sums under loss, late and missing workers, a dead switch, a killed worker and mismatched
lengths, each followed by a call that works. Virtual time: each test takes a second or two."""

from __future__ import annotations

import numpy as np
import pytest

from bml.protocol import WIDEST_LANES
from hosts.quantize import check_sum
from simulation.single import OneNicRun


def grads(workers: int = 4, floats: int = 20_000, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(floats).astype(np.float32) for _ in range(workers)]


def assert_sums(outcome, gradients, lanes: int = 64) -> None:
    assert outcome.errors == [None] * len(gradients), outcome.errors
    for result in outcome.results:
        error, bound, ok = check_sum(result, gradients, lanes)
        assert ok, f"error {error} beyond bound {bound}"


@pytest.mark.parametrize("loss", [0.0, 0.05, 0.1])
def test_sums_are_right_under_loss_and_the_next_call_too(loss):
    run = OneNicRun(4, rate=50e6, loss=loss, seed=3)
    g = grads()
    assert_sums(run.call(g), g)
    g = grads(seed=1)
    assert_sums(run.call(g), g)


def test_same_seed_same_run():
    first = OneNicRun(4, rate=20e6, loss=0.05, seed=9).call(grads())
    again = OneNicRun(4, rate=20e6, loss=0.05, seed=9).call(grads())
    assert first.ended == again.ended
    assert first.retransmissions == again.retransmissions


def test_a_late_worker_is_waited_for_with_one_probe_slot():
    """Until the first answer only one slot is re-sent: a worker 3 s late costs the others a
    probe every timeout, not their whole window again and again."""
    run = OneNicRun(4, rate=50e6, seed=1)
    g = grads()
    outcome = run.call(g, starts=[0.0, 0.0, 3.0, 0.0])
    assert_sums(outcome, g)
    assert outcome.retransmissions < 200, outcome.retransmissions


def test_a_missing_worker_ends_the_call_at_the_start_timeout_then_all_four_work():
    run = OneNicRun(4, rate=50e6, seed=2, start_timeout=3.0)
    g = grads()
    outcome = run.call(g, starts=[0.0, 0.0, 0.0, 1000.0], limit=20.0)
    for worker in range(3):
        assert "no complete answer from switch" in outcome.errors[worker], outcome.errors
        assert outcome.ended[worker] < 3.5
    run = OneNicRun(4, rate=50e6, seed=2)  # fresh workers: they ask the generation again
    assert_sums(run.call(g), g)


def test_a_dead_switch_is_named_within_seconds():
    run = OneNicRun(4, rate=5e6, seed=4)
    run.call(grads(floats=2_000), limit=60.0)
    g = grads(floats=400_000)
    run.kill_switch_at(run.clock.now + 0.5)
    outcome = run.call(g, limit=60.0)
    for error, ended in zip(outcome.errors, outcome.ended, strict=True):
        assert error is not None and "stopped answering" in error, outcome.errors
        assert ended < 0.5 + 5.0, outcome.ended


def test_a_killed_worker_ends_the_others_within_the_timeout_then_the_job_works():
    run = OneNicRun(4, rate=5e6, seed=5, timeout=6.0)
    g = grads(floats=400_000)
    run.kill_worker_at(run.clock.now + 0.5, 2)
    outcome = run.call(g, limit=30.0)
    for worker in (0, 1, 3):
        assert "chunks still unanswered" in outcome.errors[worker], outcome.errors
        assert outcome.ended[worker] <= 6.0 + 0.1
    run.killed.clear()
    g = grads(seed=6)
    assert_sums(run.call(g), g)


def test_different_lengths_are_refused_and_the_next_call_works():
    run = OneNicRun(4, rate=50e6, seed=7)
    g = grads()
    g[1] = g[1][:-5]
    outcome = run.call(g, limit=30.0)
    for error in outcome.errors:
        assert error is not None and "gradient lengths differ" in error, outcome.errors
    g = grads(seed=8)
    assert_sums(run.call(g), g)


@pytest.mark.parametrize("lanes", [256, WIDEST_LANES])
def test_wide_packets_sum_right_under_loss(lanes):
    """The same engine on a wide build: every chunk is one packet of ``lanes`` values."""
    run = OneNicRun(4, rate=100e6, loss=0.05, seed=12, lanes=lanes)
    g = grads(floats=50_000)
    assert_sums(run.call(g), g, lanes)
    g = grads(floats=50_000, seed=13)
    assert_sums(run.call(g), g, lanes)


def test_a_worker_of_another_width_is_told_so_at_once_and_the_right_width_then_works():
    """The switch's first answer (to the header-only GENERATION question) carries its
    blocks per packet: a worker sending 64 lanes to a 256-lane build fails at once with
    both widths named, instead of waiting out its timeout on dropped frames."""
    g = grads()
    outcome = OneNicRun(4, rate=50e6, seed=14, lanes=256, host_lanes=64).call(g, limit=30.0)
    for error, ended in zip(outcome.errors, outcome.ended, strict=True):
        assert error is not None and "aggregates 256 lanes per packet and this worker " \
            "sends 64" in error, outcome.errors
        assert ended < 0.5, outcome.ended
    assert_sums(OneNicRun(4, rate=50e6, seed=14, lanes=256).call(g), g, 256)
