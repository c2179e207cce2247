"""End to end on all NICs: every schedule on star:4, bcube:2,2, bcube:3,2 and bcube:2,3, with
bml-host push in every server's namespace at once, sizes that divide nothing evenly, mixed
magnitudes and 1% loss; every worker's sum within the quantiser's stated bound."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bml.protocol import WIDEST_LANES
from bml.schedule import HOST_BASED, IN_NETWORK, MIXED
from control_plane.fabric import Fabric
from control_plane.session import SwitchError
from control_plane.status import read_counters
from emulation import net
from emulation.netns import Shaping
from emulation.workers import Push, PushResult, run_pushes
from hosts.quantize import check_sum
from tests.conftest import NETNS_REASON, emulation

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")]

SIZE = 10007  # a prime: no stripe, piece or chunk divides it evenly


def gradients(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size) * 10.0 ** rng.integers(-3, 3, size)).astype(np.float32)
            for _ in range(count)]


def push_all(state, job: int, grads: list[np.ndarray | None], tmp_path,
             extra: list[str] | None = None, servers: list[int] | None = None,
             timeout: float = 120) -> list[PushResult]:
    """bml-host push on every (or the given) server at once, on all its NICs."""
    servers = list(range(len(grads))) if servers is None else servers
    return run_pushes(state, job, [Push(s, s, grads[s], None) for s in servers], tmp_path,
                      len(grads), ["--timeout", "60", *(extra or [])], timeout)


def assert_correct(results: list[PushResult], grads: list[np.ndarray], schedule: str) -> None:
    failed = [f"server {server}: exit {result.returncode}: {result.stderr.strip()}"
              for server, result in enumerate(results) if result.returncode != 0]
    assert not failed, f"{schedule}:\n" + "\n".join(failed)
    for result in results:
        error, bound, ok = check_sum(np.load(result.output), grads)
        assert ok, f"error {error} beyond bound {bound}"
        assert result.figure("schedule") == schedule


CASES = {
    "star:4": [IN_NETWORK, HOST_BASED],
    "bcube:2,2": [IN_NETWORK, HOST_BASED, MIXED],
    "bcube:3,2": [IN_NETWORK, HOST_BASED, MIXED],
    "bcube:2,3": [IN_NETWORK, HOST_BASED, MIXED],
}


@pytest.mark.parametrize("spec", sorted(CASES))
def test_every_schedule_sums_correctly_under_loss(spec, tmp_path):
    name = "tb" + spec.replace("star:", "s").replace("bcube:", "c").replace(",", "")
    with emulation(name, spec) as state:
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_scheduled_job(1)
        topo = state.topo()
        grads = gradients(topo.num_servers, SIZE, topo.num_servers)
        # The job's default (auto: the planner's choice), lossless.
        results = push_all(state, 1, grads, tmp_path)
        assert_correct(results, grads, results[0].figure("schedule"))
        net.reshape(state, Shaping(loss=1.0))
        for i, schedule in enumerate(CASES[spec]):
            grads = gradients(topo.num_servers, SIZE + i, i)
            assert_correct(push_all(state, 1, grads, tmp_path, ["--schedule", schedule]),
                           grads, schedule)


@pytest.mark.parametrize("spec", [
    pytest.param("bcube:2,2", marks=pytest.mark.skipif(net.find_bmv2() is None,
                                                        reason=net.BMV2_MISSING)),
    pytest.param("bcube:3,2", marks=pytest.mark.skipif(net.find_bmv2() is None,
                                                        reason=net.BMV2_MISSING)),
])
def test_in_network_on_bmv2(spec, tmp_path):
    name = "tv" + spec.replace("bcube:", "").replace(",", "")
    with emulation(name, spec, target="bmv2") as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(2, IN_NETWORK)
        topo = state.topo()
        grads = gradients(topo.num_servers, 3001, 5)
        assert_correct(push_all(state, 2, grads, tmp_path, ["--schedule", IN_NETWORK]),
                       grads, IN_NETWORK)


@pytest.fixture(scope="module")
def bcube22():
    with emulation("tberr", "bcube:2,2") as state:
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_scheduled_job(3, IN_NETWORK)
        yield state


def test_mismatches_are_refused_by_every_worker_and_the_next_push_works(bcube22, tmp_path):
    state = bcube22
    grads = gradients(4, 777, 1)
    # Lengths that differ: every worker refuses, nothing is summed.
    uneven = [*grads[:3], gradients(1, 778, 2)[0]]
    for result in push_all(state, 3, uneven, tmp_path):
        assert result.returncode == 2
        assert "gradient lengths differ" in result.stderr and "from 777 to 778" in result.stderr
    # A world that is not the topology's: refused before anything is sent.
    bad = run_pushes(state, 3, [Push(0, 0, grads[0], None)], tmp_path, 3)
    assert bad[0].returncode == 2
    assert "--world 3, but this server is in bcube:2,2 with 4 servers" in bad[0].stderr
    # An empty gradient: refused at once.
    empty = run_pushes(state, 3, [Push(0, 0, np.zeros(0, np.float32), None)], tmp_path, 4)
    assert empty[0].returncode == 2 and "gradient is empty" in empty[0].stderr
    # A window wider than the job's pool (512 slots): refused at once, not waited out.
    wide = run_pushes(state, 3, [Push(0, 0, grads[0], None)], tmp_path, 4, ["--window", "1024"])
    assert wide[0].returncode == 2
    assert "window 1024 is wider than job 3's pool of 512 slots" in wide[0].stderr
    # The job is still usable.
    assert_correct(push_all(state, 3, grads, tmp_path), grads, IN_NETWORK)


def test_workers_running_different_schedules_all_refuse(bcube22, tmp_path):
    state = bcube22
    grads = gradients(4, 500, 3)
    pushes = [Push(s, s, grads[s], None) for s in range(4)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(run_pushes, state, 3, pushes[:2], tmp_path / "a", 4,
                            ["--schedule", HOST_BASED, "--timeout", "20"])
        second = pool.submit(run_pushes, state, 3, pushes[2:], tmp_path / "b", 4,
                             ["--schedule", IN_NETWORK, "--timeout", "20"])
        results = first.result() + second.result()
    for result in results:
        assert result.returncode == 2
        assert "run different schedules" in result.stderr
    assert_correct(push_all(state, 3, grads, tmp_path), grads, IN_NETWORK)


def test_a_missing_worker_is_named_and_no_one_hangs(bcube22, tmp_path):
    state = bcube22
    grads = gradients(4, 500, 4)
    results = push_all(state, 3, grads, tmp_path, ["--start-timeout", "3"], servers=[0, 1, 2])
    assert [r.returncode for r in results] == [2, 2, 2]
    for result in results[1:]:  # server 3's neighbours name it
        assert "no connection within 3 s to server 3" in result.stderr
        assert "are all the job's workers running?" in result.stderr
    # Its other neighbours' giving up reaches server 0 at once.
    assert "closed its connection during the exponent exchange" in results[0].stderr
    assert_correct(push_all(state, 3, grads, tmp_path), grads, IN_NETWORK)


@pytest.fixture(scope="module")
def wide_bcube22():
    """bcube:2,2 with every switch on the widest build (2,208 values per packet)."""
    with emulation("twide", "bcube:2,2", lanes=WIDEST_LANES) as state:
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_scheduled_job(4)  # auto: the planner's choice at this width
        yield state, fabric


def test_the_widest_build_sums_right_with_the_switches_aggregating(wide_bcube22, tmp_path):
    """The job records its switches' width (read from their P4Info); bml-host reads it from
    the fabric, sends 2,208 values per packet, and the planner's schedule at that width puts
    the switches to work (their AGGREGATED counters move)."""
    state, fabric = wide_bcube22
    assert fabric.job(4).lanes == WIDEST_LANES
    before = {name: read_counters(name, *where)["aggregated"]
              for name, where in fabric.addresses().items()}
    grads = gradients(4, 100_003, 5)
    results = push_all(state, 4, grads, tmp_path)
    schedule = results[0].figure("schedule")
    assert schedule != HOST_BASED
    failed = [r.stderr for r in results if r.returncode != 0]
    assert not failed, failed
    for result in results:
        error, bound, ok = check_sum(np.load(result.output), grads, WIDEST_LANES)
        assert ok, f"error {error} beyond bound {bound}"
    after = {name: read_counters(name, *where)["aggregated"]
             for name, where in fabric.addresses().items()}
    assert all(after[name] > before[name] for name in after), (before, after)


def test_a_worker_of_another_width_fails_at_once_naming_both_and_the_job_still_works(
        wide_bcube22, tmp_path):
    state, _fabric = wide_bcube22
    grads = gradients(4, 5_000, 6)
    started = time.monotonic()
    results = push_all(state, 4, grads, tmp_path, ["--lanes", "64", "--schedule", IN_NETWORK],
                       timeout=60)
    assert time.monotonic() - started < 20  # told by the first answer, not the 60 s timeout
    for result in results:
        assert result.returncode == 2, result.stderr
        assert f"aggregates {WIDEST_LANES} lanes per packet and this worker sends 64" \
            in result.stderr, result.stderr
    results = push_all(state, 4, grads, tmp_path)
    assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]


def test_a_restarted_switch_is_given_the_wide_build_again(wide_bcube22, tmp_path):
    """The health monitor re-provisions a restarted switch with the fabric's build (its
    width), jobs included: the next pushes use it again, with no re-planning."""
    state, fabric = wide_bcube22
    net.fail_switch(state, "s0_0")
    net.restore_switch(state, "s0_0")
    grads = gradients(4, 20_000, 7)
    deadline = time.monotonic() + 40
    while True:
        try:
            before = read_counters("s0_0", *fabric.addresses()["s0_0"])["aggregated"]
        except SwitchError:  # not answering yet
            before = None
        results = push_all(state, 4, grads, tmp_path, ["--start-timeout", "3"])
        after = read_counters("s0_0", *fabric.addresses()["s0_0"])["aggregated"]
        if (before is not None and after > before
                and all(r.returncode == 0 and "replans" not in r.stdout for r in results)):
            break
        assert time.monotonic() < deadline, [r.stdout + r.stderr for r in results]
        time.sleep(1)
    for result in results:
        assert check_sum(np.load(result.output), grads, WIDEST_LANES)[2]
