"""End to end on the single-switch star: bml-host pushes through the software target."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping
from emulation.workers import Push, PushResult, run_pushes
from hosts.quantize import check_sum
from tests.conftest import NETNS_REASON, emulation

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")]


@pytest.fixture(scope="module")
def star8():
    with emulation("thost", "star:8") as state:
        yield state, Fabric.load(state.run_dir / "fabric.json")


def push(state, job: int, servers: list[int], grads: list[np.ndarray | None], tmp_path,
         extra: list[str] | None = None, world: int | None = None,
         timeout: float = 180) -> list[PushResult]:
    """bml-host push on every server at once, server i as rank i."""
    return run_pushes(state, job, [Push(server, rank, grad) for rank, (server, grad)
                                   in enumerate(zip(servers, grads, strict=True))],
                      tmp_path, world, extra, timeout)


def assert_correct(results: list[PushResult], grads: list[np.ndarray]) -> None:
    for result in results:
        assert result.returncode == 0, result.stderr
        error, bound, ok = check_sum(np.load(result.output), grads)
        assert ok, f"error {error} beyond bound {bound}"
        assert "elements=" in result.stdout and "retransmissions=" in result.stdout


def gradients(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size) * 10.0 ** rng.integers(-3, 3, size)).astype(np.float32)
            for _ in range(count)]


@pytest.mark.parametrize(("workers", "size"), [(2, 4 << 20), (4, 1 << 20), (8, 1 << 18)])
def test_workers_get_the_sum(star8, tmp_path, workers, size):
    state, fabric = star8
    job = 100 + workers
    fabric.add_job(job, list(range(workers)))
    try:
        grads = gradients(workers, size, workers)
        assert_correct(push(state, job, list(range(workers)), grads, tmp_path), grads)
    finally:
        fabric.remove_job(job)


def push_under(state, fabric, tmp_path, job: int, shaping: Shaping, seed: int,
               check=lambda: None) -> None:
    """Four workers push through links impaired by ``shaping``; every sum is still right and
    the transport had to repair something (and ``check`` holds while the shaping is on)."""
    fabric.add_job(job, [0, 1, 2, 3])
    net.reshape(state, shaping)
    try:
        grads = gradients(4, 1 << 17, seed)
        results = push(state, job, [0, 1, 2, 3], grads, tmp_path)
        assert_correct(results, grads)
        retransmissions = sum(int(r.figure("retransmissions")) for r in results)
        assert retransmissions > 0  # the impairment was real and was repaired
        check()
    finally:
        net.reshape(state, Shaping())
        fabric.remove_job(job)


@pytest.mark.parametrize("loss", [1.0, 5.0])
def test_correct_under_loss(star8, tmp_path, loss):
    push_under(*star8, tmp_path, 200 + int(loss), Shaping(loss=loss), int(loss))


@pytest.mark.parametrize("loss", [1.0, 5.0])
def test_correct_under_loss_and_reordering(star8, tmp_path, loss):
    state, fabric = star8
    push_under(state, fabric, tmp_path, 210 + int(loss), Shaping(loss=loss, reorder=25.0),
               10 + int(loss), check=lambda: detoured(state, [0, 1, 2, 3]))


def detoured(state, servers: list[int]) -> None:
    """The reordering was real: a quarter of each server's packets took the detour."""
    for server in servers:
        rules = subprocess.run(["ip", "netns", "exec", state.namespace_of(server), "nft",
                                "list", "table", "netdev", "bml_eth0"],
                               capture_output=True, text=True, check=True).stdout
        packets = int(re.search(r"counter packets (\d+) bytes \d+ fwd to \"eth0ra\"",
                                rules).group(1))
        assert packets > 100, rules


def test_two_concurrent_jobs_on_one_switch(star8, tmp_path):
    state, fabric = star8
    fabric.add_job(301, [0, 1, 2, 3])
    fabric.add_job(302, [4, 5, 6, 7])
    try:
        a, b = gradients(4, 1 << 18, 301), gradients(4, 1 << 18, 302)
        with ThreadPoolExecutor(2) as pool:  # both jobs' pushes run at the same time
            first = pool.submit(push, state, 301, [0, 1, 2, 3], a, tmp_path)
            second = pool.submit(push, state, 302, [4, 5, 6, 7], b, tmp_path)
            outcome = {301: first.result(timeout=200), 302: second.result(timeout=200)}
        assert_correct(outcome[301], a)
        assert_correct(outcome[302], b)
    finally:
        fabric.remove_job(301)
        fabric.remove_job(302)


def test_lengths_differ_clear_error_everywhere(star8, tmp_path):
    state, fabric = star8
    fabric.add_job(401, [0, 1, 2])
    try:
        grads = [np.ones(1000, np.float32), np.ones(1000, np.float32),
                 np.ones(1064, np.float32)]
        started = time.monotonic()
        results = push(state, 401, [0, 1, 2], grads, tmp_path, ["--timeout", "20"])
        assert time.monotonic() - started < 30
        for result in results:
            assert result.returncode != 0
            assert "gradient lengths differ" in result.stderr
            assert not result.output.exists()
    finally:
        fabric.remove_job(401)


def test_missing_file_and_bad_input(star8, tmp_path):
    state, _ = star8
    missing = push(state, 1, [0], [None], tmp_path)[0]
    assert missing.returncode == 2 and "no gradient file" in missing.stderr
    bad = np.ones(100, np.float32)
    bad[3] = np.nan
    refused = push(state, 1, [0], [bad], tmp_path)[0]
    assert refused.returncode == 2 and "NaN" in refused.stderr
    assert not refused.output.exists()


def test_wrong_job_fails_fast_with_a_hint(star8, tmp_path):
    state, _ = star8
    started = time.monotonic()
    results = push(state, 999, [0, 1], gradients(2, 1000, 9), tmp_path,
                   ["--start-timeout", "3"])
    assert time.monotonic() - started < 15
    for result in results:
        assert result.returncode == 2
        assert "is job 999 set up on it" in result.stderr
        assert not result.output.exists()
    counters = subprocess.run([sys.executable, "-m", "control_plane.cli", "--fabric",
                               str(state.run_dir / "fabric.json"), "counters"],
                              capture_output=True, text=True, timeout=30).stdout
    assert "drop:unknown_job" in counters


def test_dead_worker_stops_the_others_with_an_error(star8, tmp_path):
    """Worker 2 never starts: the other two stop within their bound and say why."""
    state, fabric = star8
    fabric.add_job(501, [0, 1, 2])
    try:
        results = push(state, 501, [0, 1], gradients(2, 5000, 5), tmp_path,
                       ["--start-timeout", "3", "--timeout", "10"], world=3)
        for result in results:
            assert result.returncode == 2 and "are all of them running" in result.stderr
            assert not result.output.exists()
    finally:
        fabric.remove_job(501)
