"""A switch or a link fails mid-push.

On a BCube every worker re-plans around it within seconds: the failed group's level runs in
the hosts over detours through relay servers (BCube's other paths), the push finishes with
every sum right and prints the new plan and its recovery time; after the repair (``bml-net
restore``; the monitor re-provisions a restarted switch) the next push uses the switch again.
On a star there is no other path: every worker stops within a bounded time naming the switch
or the NIC, and once the fault is repaired the same job sums right.
"""

from __future__ import annotations

import time

import pytest

from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping
from emulation.workers import (
    progress_stat,
    run_pushes,
    start_pushes,
    wait_for_progress,
    wait_pushes,
)
from tests.conftest import NETNS_REASON, emulation
from tests.test_faults_control import TARGETS
from tests.test_faults_worker import assert_correct, gradients, pushes

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")]

JOB = 41
TIMEOUT = 60  # the pushes' own bound: detection must come long before it


@pytest.fixture(scope="module")
def star4():
    with emulation("tsw", "star:4") as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, "in-network")
        yield state


def wait_until_provisioned(state, job: int, timeout: float = 30.0, servers: int = 4) -> float:
    """Seconds until a push of ``job`` works again on the whole plan after a repair (the
    monitor notices the restarted switch and re-provisions it; until then a push is refused
    on a star, and re-planned around the switch on a BCube, which is not yet its use)."""
    started = time.monotonic()
    grads = gradients(servers, 2_000, 3)
    while True:
        results = run_pushes(state, job, pushes(grads, None), state.run_dir, servers,
                             ["--start-timeout", "2", "--timeout", "10"])
        if all(r.returncode == 0 and "replans=" not in r.stdout for r in results):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, [r.stderr for r in results]


def test_killed_switch_is_named_within_seconds_and_the_job_works_after_restore(star4, tmp_path):
    grads = gradients(4, 1 << 20, 21)
    running = start_pushes(star4, JOB, pushes(grads, None), tmp_path, 4,
                           ["--timeout", str(TIMEOUT)])
    wait_for_progress(star4, 4000, running=running)
    net.fail_switch(star4, "s0")
    failed = time.monotonic()
    results = wait_pushes(running, TIMEOUT + 30)
    detected = time.monotonic() - failed
    for result in results:
        assert result.returncode == 2
        assert "switch s0 (10.1.255.1, level 0) stopped answering" in result.stderr, \
            result.stderr
        assert "no re-planning around it: star:4 has one switch level" in result.stderr
        assert not result.output.exists()
    assert detected < 10, f"{detected:.1f} s to notice a dead switch"
    net.restore_switch(star4, "s0")
    print(f"\ndead switch noticed by every worker in {detected:.1f} s; pushes work again "
          f"{wait_until_provisioned(star4, JOB):.1f} s after the restart")
    grads = gradients(4, 100_003, 22)
    assert_correct(run_pushes(star4, JOB, pushes(grads, None), tmp_path, 4), grads)


def test_nic_down_mid_push_is_named_and_the_job_works_after_restore(star4, tmp_path):
    """Its worker sees its switch go silent; on a star nothing else reaches the others, which
    stop at their timeout, naming the server they have no DONE from."""
    grads = gradients(4, 1 << 20, 23)
    running = start_pushes(star4, JOB, pushes(grads, None), tmp_path, 4, ["--timeout", "15"])
    wait_for_progress(star4, 4000, running=running)
    net.fail_link(star4, "h1", "eth0", end="switch")  # the NIC loses its carrier
    failed = time.monotonic()
    results = wait_pushes(running, TIMEOUT + 30)
    detected = time.monotonic() - failed
    assert [r.returncode for r in results] == [2, 2, 2, 2], "\n".join(r.stderr for r in results)
    assert "switch s0 (10.1.255.1, level 0) stopped answering" in results[1].stderr
    errors = [r.stderr for r in results]
    assert all("1 (level 0)" in errors[i] for i in (0, 2, 3)), errors
    assert detected < 15 + 10, (f"{detected:.1f} s to notice the NIC down", errors)
    net.restore_link(star4, "h1", "eth0")
    grads = gradients(4, 100_003, 24)
    assert_correct(run_pushes(star4, JOB, pushes(grads, None), tmp_path, 4), grads)


# --- BCube: re-planned around the failed part --------------------------------------------

def replanned(results, cause: str, switch: str, servers: str) -> None:
    """Every push finished, re-planned once, naming the cause and the failed group."""
    everything = "\n".join(f"server {i}: rc {r.returncode}\n{r.stdout}{r.stderr}"
                            for i, r in enumerate(results))
    for result in results:
        assert result.returncode == 0, everything
        assert result.figure("replans") == "1", result.stdout
        assert cause in result.stdout, result.stdout
        assert (f"switch {switch} failed: servers {servers} run level" in result.stdout), \
            result.stdout
        recovery = float(result.stdout.split("bml-host: recovery: ")[1].split()[0])
        assert 0 < recovery < 15, result.stdout


def fault_mid_push(state, job: int, schedule: str, tmp_path, inject, size: int = 1 << 20,
                   progress: int = 3000):
    """Pushes by every server on every NIC; ``inject`` once ``progress`` contributions are
    in (host-based, where the switches add none: packets routed). Returns (results,
    gradients)."""
    servers = state.topo().num_servers
    grads = gradients(servers, size, 31)
    running = start_pushes(state, job, pushes(grads, None), tmp_path, servers,
                           ["--timeout", str(TIMEOUT), "--schedule", schedule])
    wait_for_progress(state, progress, running=running, stat=progress_stat(schedule))
    inject()
    return wait_pushes(running, TIMEOUT + 30), grads


def used_again(state, tmp_path, servers: int, seed: int) -> None:
    """After the repair, a push by every server sums right on the whole plan: the repaired
    part is used again (no re-planning)."""
    grads = gradients(servers, 100_003, seed)
    results = run_pushes(state, JOB, pushes(grads, None), tmp_path, servers)
    assert_correct(results, grads)
    replanning = [f"server {i}: {r.stdout}" for i, r in enumerate(results) if "replans" in r.stdout]
    assert not replanning, "\n".join(replanning)


@pytest.mark.parametrize("target", TARGETS)
def test_bcube_switch_killed_is_replanned_and_used_again_after_restore(target, tmp_path):
    """bcube:2,2 in-network: level-1 switch s1_0 (servers 0 and 2) is killed mid-push."""
    with emulation(f"trs{target[0]}", "bcube:2,2", target=target) as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, "in-network")
        size = 1 << 20 if target == "soft" else 1 << 17
        results, grads = fault_mid_push(state, JOB, "in-network", tmp_path,
                                        lambda: net.fail_switch(state, "s1_0"), size)
        replanned(results, "switch s1_0 (10.2.255.1, level 1) stopped answering", "s1_0",
                  "0, 2")
        assert_correct(results, grads)
        net.restore_switch(state, "s1_0")
        wait_until_provisioned(state, JOB, servers=4)
        used_again(state, tmp_path, 4, 32)


def pushed_right_from_the_start(state, tmp_path, seed: int) -> tuple[list, float]:
    """bcube:2,2: four fresh workers push (their meshes made in the push, a 30 s start
    timeout) and every sum is right; returns their results and how long the pushes took."""
    grads = gradients(4, 100_003, seed)
    started = time.monotonic()
    results = run_pushes(state, JOB, pushes(grads, None), tmp_path, 4,
                         ["--start-timeout", "30", "--timeout", str(TIMEOUT)])
    took = time.monotonic() - started
    assert_correct(results, grads)
    return results, took


def test_bcube_switch_down_before_the_push_is_planned_around_before_the_start_timeout(
        tmp_path):
    """bcube:2,2 in-network, s1_0 (servers 0 and 2) down before any worker starts: those two
    cannot connect on level 1, asked the switch as their mesh began, find it silent 3 s
    later (or the later of them learns it from the other's greeting over the detour) and
    connect over the detour, long before their 30 s start timeout; the others take
    the broken group over in the exponent exchange. Every sum is right, and after the
    restore the next push uses the switch again."""
    with emulation("tdb", "bcube:2,2") as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, "in-network")
        net.fail_switch(state, "s1_0")
        results, took = pushed_right_from_the_start(state, tmp_path, 35)
        # Each of its two servers re-planned around s1_0: having found it silent, or told by
        # the other's greeting over the detour, whichever came first; one found it itself.
        silent = "switch(es) s1_0 did not answer while the mesh was made"
        said = {server: results[server].stdout for server in (0, 2)}
        for server, out in said.items():
            told = f"switch(es) s1_0 gone around by server {2 - server}"
            assert silent in out or told in out, out
        assert any(silent in out for out in said.values()), said
        assert took < 30, f"the pushes took {took:.1f} s: the switch was found at the start " \
            "timeout, not while the mesh was made"
        print(f"\npushes around a switch down before their start: {took:.1f} s")
        net.restore_switch(state, "s1_0")
        wait_until_provisioned(state, JOB, servers=4)
        used_again(state, tmp_path, 4, 36)


def test_bcube_nic_down_before_the_push_is_planned_around_by_both_ends(tmp_path):
    """bcube:2,2 in-network, server 1's link to s0_0 down before any worker starts. Only
    server 1 sees it (its switch silent); server 0, which dials it on level 0, sees its switch
    answer and its dials go unanswered. Its next dial goes around the switch, server 1 keeps
    it (it planned the detour 3 s in) and says so, and server 0 plans the detour too: every
    sum is right long before the 30 s start timeout, and after the restore the next push
    uses the link again."""
    with emulation("tdn", "bcube:2,2") as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, "in-network")
        net.fail_link(state, "h1", "eth0", end="switch")
        results, took = pushed_right_from_the_start(state, tmp_path, 37)
        said = results[1].stdout
        assert "switch(es) s0_0 did not answer while the mesh was made" in said, said
        said = results[0].stdout
        assert "switch(es) s0_0 gone around by server 1" in said, said
        assert took < 30, f"the pushes took {took:.1f} s: the two ends did not agree on the " \
            "detour while the mesh was made"
        print(f"\npushes around a NIC down before their start: {took:.1f} s")
        net.restore_link(state, "h1", "eth0")
        used_again(state, tmp_path, 4, 38)


def test_bcube_nic_down_is_replanned_and_used_again_after_restore(tmp_path):
    """bcube:3,2 mixed: server 4's level-0 NIC loses its carrier mid-push; its group (3, 4, 5)
    runs level 0 in the hosts. Links at 5 Mbit/s, so that the push outlasts the detection
    (unshaped, the software target sums 1M floats before a silent switch is declared down)."""
    with emulation("trl", "bcube:3,2", shaping=Shaping(rate="5mbit")) as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, "mixed")
        results, grads = fault_mid_push(
            state, JOB, "mixed", tmp_path,
            lambda: net.fail_link(state, "h4", "eth0", end="switch"), size=1 << 20)
        replanned(results, "switch s0_1 (10.1.255.2, level 0) stopped answering", "s0_1",
                  "3, 4, 5")
        assert_correct(results, grads)
        net.restore_link(state, "h4", "eth0")
        used_again(state, tmp_path, 9, 33)


def test_bcube_switch_killed_under_host_based_bml_is_replanned_and_used_again(tmp_path):
    """bcube:2,2 host-based, where the switches only route the hosts' streams: level-0
    switch s0_1 (servers 2 and 3) is killed mid-push. Its NICs see no answers to wait for,
    only streams that stop: the switch watch asks once they pause, every worker re-plans
    (level 0 of that group over detours) and sums right, and after the restore the next push
    goes through the switch again. Links at 5 Mbit/s, so that the push outlasts the
    detection."""
    with emulation("trh", "bcube:2,2", shaping=Shaping(rate="5mbit")) as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, "host-based")
        # A third of the push's packets (about 2,800 of 9,000 bytes): nobody holds a whole sum.
        results, grads = fault_mid_push(state, JOB, "host-based", tmp_path,
                                        lambda: net.fail_switch(state, "s0_1"), size=1 << 20,
                                        progress=900)
        replanned(results, "switch s0_1 (10.1.255.2, level 0)", "s0_1", "2, 3")
        assert_correct(results, grads)
        net.restore_switch(state, "s0_1")
        wait_until_provisioned(state, JOB, servers=4)
        used_again(state, tmp_path, 4, 34)


def test_bcube_switch_killed_at_a_pushs_end_leaves_its_sums_to_those_that_hold_them(tmp_path):
    """bcube:2,2 host-based, s0_1 killed nine tenths into the push: servers 0 and 1 already
    hold the whole sum, so 2 and 3 (cut off from each other) ask them for the blocks they
    miss instead of running the push again (which would need 0 and 1, about to return).
    Every sum is right; 2 and 3 name the failure, and the next push after the restore uses
    the switch again."""
    with emulation("trz", "bcube:2,2", shaping=Shaping(rate="5mbit")) as state:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, "host-based")
        results, grads = fault_mid_push(state, JOB, "host-based", tmp_path,
                                        lambda: net.fail_switch(state, "s0_1"), size=1 << 20,
                                        progress=3000)
        assert_correct(results, grads)
        for server in (2, 3):
            said = results[server].stdout
            assert f"a failure came at the end: job {JOB} server {server}" in said, said
            assert "switch s0_1 (10.1.255.2, level 0) stopped answering" in said, said
            assert int(results[server].figure("salvaged")) > 0, said
            assert "replans=" not in said, said
        net.restore_switch(state, "s0_1")
        wait_until_provisioned(state, JOB, servers=4)
        used_again(state, tmp_path, 4, 35)
