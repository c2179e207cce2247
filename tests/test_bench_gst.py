"""How the benchmarks time an allreduce (``benchmarks.common.Run.gst``)."""

import pytest

from benchmarks.common import Run


def report(rank: int, begun: list[float], seconds: list[float]) -> dict:
    return {"rank": rank, "seconds": seconds[0], "seconds_each": seconds, "begun_each": begun,
            "nics": {}}


def test_gst_runs_from_the_last_workers_start_to_the_last_sum():
    # Call 1: all start at 0, the last sum at 1.0. Call 2: worker 0 starts 0.3 s before
    # worker 1 (which finished call 1 later) and waits for it: 1.0 s of allreduce, not 1.3.
    run = Run([report(0, [0.0, 1.0], [0.9, 1.3]), report(1, [0.0, 1.3], [1.0, 1.0])],
              correct=True, workers=2)
    assert run.gst == pytest.approx(1.0)


def test_gst_is_the_median_of_the_calls():
    run = Run([report(0, [0.0, 2.0, 5.0], [1.0, 2.0, 1.5]),
               report(1, [0.0, 2.0, 5.0], [1.2, 1.9, 1.4])], correct=True, workers=2)
    assert run.gst == pytest.approx(1.5)


def test_reports_without_start_times_give_the_slowest_workers_time():
    run = Run([{"rank": 0, "seconds": 1.0, "nics": {}}, {"rank": 1, "seconds": 1.4, "nics": {}}],
              correct=True, workers=2)
    assert run.gst == 1.4
