"""A worker fails mid-push: every survivor stops with an error that names what is missing, and
the job is usable at once by fresh workers, with no operator action (docs/PROTOCOL.md,
"Generations"). Each test ends by pushing again and checking every sum."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bml.paths import REPO_ROOT
from control_plane.fabric import Fabric
from emulation.netns import Shaping
from emulation.workers import (
    Push,
    PushResult,
    run_pushes,
    start_pushes,
    wait_for_progress,
    wait_pushes,
)
from hosts.quantize import check_sum
from tests.conftest import NETNS_REASON, emulation

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")]

ALL_NICS, ONE_NIC = 31, 32  # the star's two jobs: every NIC (the engine), --interface eth0
ELASTIC = 33  # every NIC, set up to shrink to its survivors


@pytest.fixture(scope="module")
def star4():
    with emulation("tflt", "star:4") as state:
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_scheduled_job(ALL_NICS, "in-network")
        fabric.add_job(ONE_NIC, [0, 1, 2, 3])
        fabric.add_scheduled_job(ELASTIC, "in-network", elastic=True)
        yield state


def gradients(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]


def pushes(grads: list[np.ndarray], interface: str | None) -> list[Push]:
    return [Push(server, server, grad, interface) for server, grad in enumerate(grads)]


def assert_correct(results: list[PushResult], grads: list[np.ndarray]) -> None:
    for result in results:
        assert result.returncode == 0, result.stderr
        error, bound, ok = check_sum(np.load(result.output), grads)
        assert ok, f"error {error} beyond bound {bound}"


def kill_mid_push(state, job: int, interface: str | None, tmp_path, victim: int,
                  stop: bool = False, extra: list[str] | None = None) -> list[PushResult]:
    """Four pushes of a large gradient; ``victim`` is killed (or frozen, ``stop``) once the
    others have made progress. The victim's own result is left out."""
    grads = gradients(4, 1 << 20, 7)
    running = start_pushes(state, job, pushes(grads, interface), tmp_path, 4, extra)
    wait_for_progress(state, 4000, running=running)  # well into the push: about a quarter of it
    process = running[victim][1]
    assert process.poll() is None, "the push ended before the fault: make it longer"
    os.kill(process.pid, signal.SIGSTOP if stop else signal.SIGKILL)
    try:
        results = wait_pushes([r for i, r in enumerate(running) if i != victim], 60)
    finally:
        if stop:
            os.kill(process.pid, signal.SIGKILL)
        process.communicate()
    return results


@pytest.mark.parametrize("interface", [None, "eth0"], ids=["all-nics", "one-nic"])
def test_killed_worker_stops_the_others_and_the_job_works_again(star4, tmp_path, interface):
    job = ALL_NICS if interface is None else ONE_NIC
    started = time.monotonic()
    results = kill_mid_push(star4, job, interface, tmp_path, victim=2,
                            extra=["--timeout", "6"])
    waited = time.monotonic() - started
    for result in results:
        assert result.returncode == 2, result.stdout
        if interface is None:  # its neighbours see its connection close, and name it
            assert "server 2 (level 0) closed its connection mid-call" in result.stderr
        else:  # one NIC: the switch only; the worker names the chunks and what to check
            assert "chunks still unanswered" in result.stderr
            assert "a worker or the switch stopped" in result.stderr
        assert not result.output.exists()
    assert waited < 6 + 20  # within the timeout (and start-up), never a hang
    grads = gradients(4, 100_003, 8)
    assert_correct(run_pushes(star4, job, pushes(grads, interface), tmp_path, 4), grads)


def test_elastic_job_finishes_without_a_killed_worker_and_goes_on(star4, tmp_path):
    """An elastic job (bml-ctl job-add --elastic): server 2 is killed mid-push; the other three
    finish, each with the sum of the three survivors' gradients, and say so; a worker that
    keeps going (the Python API, many calls) would go on as a job of three. The next push of
    the job by four fresh workers uses the switch again."""
    grads = gradients(4, 1 << 20, 7)
    results = kill_mid_push(star4, ELASTIC, None, tmp_path, victim=2,
                            extra=["--fabric", str(star4.run_dir / "fabric.json")])
    survivors = [grads[0], grads[1], grads[3]]
    assert_correct(results, survivors)
    for result in results:
        assert "server 2 (level 0) closed its connection mid-call" in result.stdout
        assert "servers 0, 1, 3 go on without 2 (elastic)" in result.stdout
        assert result.figure("summed_over") == "0,1,3"
    grads = gradients(4, 100_003, 12)
    results = run_pushes(star4, ELASTIC, pushes(grads, None), tmp_path, 4)
    assert_correct(results, grads)
    assert all("summed_over" not in r.stdout for r in results)


ELASTIC_CALLS = """
import os, sys, threading, numpy as np
from hosts.api import Worker
rank = int(sys.argv[1])
with Worker(int(sys.argv[3]), elastic=True) as worker:
    for call in range(3):
        gradient = np.random.default_rng(100 * call + rank).standard_normal(1_000_000)
        if rank == 2 and call == 1:
            threading.Timer(0.1, lambda: os._exit(9)).start()
        np.save(f"{sys.argv[2]}/sum{rank}-{call}.npy", worker.allreduce(gradient.astype("f4")))
        print(call, ",".join(map(str, worker.engine.members)), flush=True)
"""


def test_elastic_worker_goes_on_as_the_smaller_job(star4, tmp_path):
    """Three calls of the Python API with ``elastic=True``; server 2 vanishes in the second.
    The others' second and third sums are the three survivors' sums."""
    processes = [subprocess.Popen(
        ["ip", "netns", "exec", star4.namespace_of(rank), sys.executable, "-c", ELASTIC_CALLS,
         str(rank), str(tmp_path), str(ELASTIC)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
        stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        for rank in range(4)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert processes[2].returncode == 9
    for rank in (0, 1, 3):
        assert processes[rank].returncode == 0, outputs[rank][1]
        assert outputs[rank][0].split() == ["0", "0,1,2,3", "1", "0,1,3", "2", "0,1,3"]
        for call in range(3):
            grads = [np.random.default_rng(100 * call + member).standard_normal(1_000_000)
                     .astype(np.float32) for member in ((0, 1, 2, 3) if call == 0 else
                                                        (0, 1, 3))]
            assert check_sum(np.load(tmp_path / f"sum{rank}-{call}.npy"), grads)[2]


IN_PLACE_CALLS = """
import sys, numpy as np
from hosts.api import Worker
from hosts.quantize import GradientError
rank, folder, job = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
interface = sys.argv[4] if len(sys.argv) > 4 else None
gradient = np.random.default_rng(rank).standard_normal(300_003).astype("f4")
with Worker(job, rank, 4, interface=interface) as worker:
    try:  # refused before anything is sent, the gradient untouched
        worker.allreduce(gradient, out=np.empty(300_000, "f4"))
    except GradientError as exc:
        print("refused:", exc)
    kept = gradient.copy()
    out = np.full((3, 100_001), np.nan, "f4")
    assert worker.allreduce(kept, out=out) is out and np.array_equal(kept, gradient)
    np.save(f"{folder}/out{rank}.npy", out.reshape(-1))
    assert worker.allreduce(gradient, out=gradient) is gradient  # in place
    np.save(f"{folder}/in-place{rank}.npy", gradient)
"""


@pytest.mark.parametrize("interface", [None, "eth0"], ids=["all-nics", "one-nic"])
def test_python_api_writes_the_sum_into_a_given_array_or_in_place(star4, tmp_path, interface):
    """``Worker.allreduce(gradient, out=...)``: the sum lands in the caller's array (of
    another shape, same size) and nowhere else, or replaces the gradient itself; an ``out``
    of the wrong size is refused with its reason before anything is sent, and the job's
    next calls are right."""
    job = ALL_NICS if interface is None else ONE_NIC
    processes = [subprocess.Popen(
        ["ip", "netns", "exec", star4.namespace_of(rank), sys.executable, "-c",
         IN_PLACE_CALLS, str(rank), str(tmp_path), str(job), *([interface] if interface else [])],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}) for rank in range(4)]
    outputs = [process.communicate(timeout=120) for process in processes]
    grads = [np.random.default_rng(rank).standard_normal(300_003).astype(np.float32)
             for rank in range(4)]
    for rank, process in enumerate(processes):
        assert process.returncode == 0, outputs[rank][1]
        assert ("refused: out must be a writable C-contiguous float32 array of the gradient's "
                "300003 values; got float32 of 300000 values") in outputs[rank][0]
        for name in ("out", "in-place"):
            assert check_sum(np.load(tmp_path / f"{name}{rank}.npy"), grads)[2], name


def test_frozen_worker_times_the_others_out_and_the_job_works_again(star4, tmp_path):
    """A worker that stops answering without closing anything (SIGSTOP): the others give up
    after their timeout and name it; its slots hold a partial call; fresh workers sum right."""
    results = kill_mid_push(star4, ALL_NICS, None, tmp_path, victim=1, stop=True,
                            extra=["--timeout", "5"])
    assert [r.returncode for r in results] == [2, 2, 2]
    # The first to time out names the silent server; the others may hear that one leave first.
    timed_out = [r.stderr for r in results if "still missing after" in r.stderr]
    assert timed_out and all("no DONE yet from server(s)" in e and "1 (level 0)" in e
                             for e in timed_out), [r.stderr for r in results]
    grads = gradients(4, 70_001, 9)
    assert_correct(run_pushes(star4, ALL_NICS, pushes(grads, None), tmp_path, 4), grads)


def test_bcube_killed_worker_and_the_job_works_again(tmp_path):
    """bcube:2,2, in-network on every NIC of every server: server 3 is killed mid-push."""
    with emulation("tfltb", "bcube:2,2") as state:
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_scheduled_job(5, "in-network")
        results = kill_mid_push(state, 5, None, tmp_path, victim=3, extra=["--timeout", "6"])
        for result in results:
            assert result.returncode == 2
        named = [r for r in results if "server 3" in r.stderr]
        assert named, [r.stderr for r in results]  # its neighbours (1 and 2) name it
        grads = gradients(4, 100_003, 10)
        assert_correct(run_pushes(state, 5, pushes(grads, None), tmp_path, 4), grads)


def test_wrong_world_is_named_and_the_job_works_again(star4, tmp_path):
    """Every worker of the 4-worker job says --world 5 (one NIC): each is told the switch sums
    4 workers, at the priming round, instead of a mis-scaled sum or a timeout."""
    grads = gradients(4, 5000, 11)
    results = run_pushes(star4, ONE_NIC, pushes(grads, "eth0"), tmp_path, world=5)
    for result in results:
        assert result.returncode == 2
        assert "--world 5, but the switch sums the contributions of 4 workers" in result.stderr
        assert not result.output.exists()
    assert_correct(run_pushes(star4, ONE_NIC, pushes(grads, "eth0"), tmp_path, 4), grads)


def test_empty_gradient_is_refused_before_anything_is_sent(star4, tmp_path):
    results = run_pushes(star4, ALL_NICS, [Push(0, 0, np.zeros(0, np.float32), None)],
                         tmp_path, 4, ["--start-timeout", "2"])
    assert results[0].returncode == 2
    assert "gradient is empty: nothing to sum" in results[0].stderr


@pytest.mark.parametrize("loss", [5.0, 10.0])
def test_loss_and_reordering_with_the_default_timeouts(tmp_path, loss):
    """5% and 10% loss each way and 25% reordering on every link: every sum right, with the
    default timeouts (goodput: benchmarks/faults.py)."""
    with emulation("tloss", "star:4", shaping=Shaping(None, None, loss, 25.0)) as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(ALL_NICS, "in-network")
        grads = gradients(4, 200_003, 12)
        assert_correct(run_pushes(state, ALL_NICS, pushes(grads, None), tmp_path, 4), grads)
