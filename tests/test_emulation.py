"""bml-net and bml-ctl: topologies come up provisioned, pass traffic, show counters, go away."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from control_plane.fabric import Fabric
from control_plane.status import read_events
from emulation import net
from emulation.net import State
from emulation.netns import (
    SERVER_TCP_LIMIT_OUTPUT_BYTES,
    SERVER_TCP_RMEM_MAX,
    Shaping,
    kernel_has_netem,
)
from emulation.workers import Push, run_pushes
from hosts.quantize import check_sum
from tests.conftest import NETNS_REASON, emulation

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")]


def ping(state: State, server: int, ip: str) -> bool:
    done = subprocess.run(["ip", "netns", "exec", state.namespace_of(server), "ping", "-c", "1",
                           "-W", "2", ip], capture_output=True, text=True)
    return done.returncode == 0


def push_and_check(state: State, job: int, servers: list[int], tmp_path, size: int = 5000,
                   level: int = 0) -> None:
    """The servers on one level-``level`` switch push random gradients through their NIC of
    that level, worker id = their digit on it; every sum is within the stated bound."""
    topo = state.topo()
    rng = np.random.default_rng(job)
    grads = [rng.standard_normal(size).astype(np.float32) for _ in servers]
    pushes = [Push(server, topo.digits(server)[level], grad, f"eth{level}")
              for server, grad in zip(servers, grads, strict=True)]
    for result in run_pushes(state, job, pushes, tmp_path, extra=["--timeout", "60"]):
        assert result.returncode == 0, result.stderr
        error, bound, ok = check_sum(np.load(result.output), grads)
        assert ok, f"error {error} beyond bound {bound}"


def test_star4_up_ping_aggregate_status_down(tmp_path):
    with emulation("tstar", "star:4") as state:
        topo = state.topo()
        for a in range(4):
            for b in range(4):
                if a != b:
                    assert ping(state, a, topo.nics(b)[0].ip), f"h{a} cannot ping h{b}"
        # Every TCP scheme gets the same server TCP: receive buffer and NIC queue share.
        for key, value in (("tcp_rmem", SERVER_TCP_RMEM_MAX),
                           ("tcp_limit_output_bytes", SERVER_TCP_LIMIT_OUTPUT_BYTES)):
            got = subprocess.run(["ip", "netns", "exec", state.namespace_of(0), "sysctl", "-n",
                                  f"net.ipv4.{key}"], capture_output=True, text=True).stdout
            assert int(got.split()[-1]) == value, (key, got)
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_job(1, [0, 1, 2, 3])
        push_and_check(state, 1, [0, 1, 2, 3], tmp_path)
        status = "\n".join(net.status_lines(state))
        assert "s0" in status and "aggregated" in status
        ctl = subprocess.run([sys.executable, "-m", "control_plane.cli", "--fabric",
                              str(state.run_dir / "fabric.json"), "status"],
                             capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0, ctl.stderr
        lines = ctl.stdout.splitlines()
        switch_row = next(line for line in lines if line.startswith("s0 "))
        assert switch_row.split()[-2:] == ["yes", "bml"]  # answers, runs our pipeline
        header = next(i for i, line in enumerate(lines) if line.startswith("counters "))
        columns = lines[header].split()
        counts = dict(zip(columns[1:], map(int, lines[header + 1].split()[1:]), strict=True))
        assert lines[header + 1].startswith("s0 ")
        # Every completed slot took 4 contributions; a worker that started later than another
        # may have made it prime again at a newer generation (hosts/transport.py).
        assert counts["aggregated"] >= 4 * counts["completed"] > 0
    assert not any(name.startswith("tstar-") for name in net.netns.namespaces())


@pytest.mark.parametrize("target", [
    "soft",
    pytest.param("bmv2", marks=pytest.mark.skipif(
        net.find_bmv2() is None, reason=net.BMV2_MISSING)),
])
def test_bcube22_every_level_pings_and_aggregates(tmp_path, target):
    with emulation(f"tb{target}", "bcube:2,2", target=target) as state:
        topo = state.topo()
        fabric = Fabric.load(state.run_dir / "fabric.json")
        for level in range(2):
            for server in range(4):
                for peer in topo.neighbours(server, level):
                    assert ping(state, server, topo.nics(peer)[level].ip), \
                        f"h{server} cannot reach h{peer} over level {level}"
        for level in range(2):
            job = 10 + level
            fabric.add_job(job, [0, 1, 2, 3], level=level)
            for sw in (s for s in topo.switches if s.level == level):
                push_and_check(state, job, list(sw.servers), tmp_path, 3000, level)


@pytest.mark.parametrize(("topo", "message"), [
    ("bcube:1,2", "n must be at least 2"),
    ("bcube:3,0", "k must be at least 1"),
    ("bcube:6,2", "this machine"),
    ("ring:3", "use star:N or bcube:n,k"),
])
def test_bad_requests_refused_before_anything_is_made(topo, message):
    if topo == "bcube:6,2" and (os.cpu_count() or 1) * net.SERVERS_PER_CORE >= 36:
        pytest.skip("this machine could hold bcube:6,2")
    done = subprocess.run([sys.executable, "-m", "emulation.net", "--name", "tbad", "up",
                           "--topo", topo], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr
    assert net.leftovers("tbad") == []


def test_bmv2_requested_but_missing_is_refused(monkeypatch):
    # A machine without BMv2: nothing in $BMV2_SWITCH, on PATH or in the usual prefixes.
    monkeypatch.delenv("BMV2_SWITCH", raising=False)
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    monkeypatch.setattr(net, "BMV2_SEARCH", ())
    assert net.find_bmv2() is None
    with pytest.raises(net.NetError, match="simple_switch_grpc is not installed"):
        net.up("tbad", "star:2", target="bmv2")
    assert net.leftovers("tbad") == []


def test_impossible_shaping_refused_before_anything_is_made():
    with pytest.raises(net.NetError, match="loss must be a percentage"):
        net.up("tbad", "star:2", shaping=Shaping(loss=100.0))
    if not kernel_has_netem():
        with pytest.raises(net.NetError, match="delay needs the kernel's netem qdisc"):
            net.up("tbad", "star:2", shaping=Shaping(delay="1ms"))
    assert net.leftovers("tbad") == []


def test_tcp_waits_at_least_as_long_as_the_link_queue_takes_to_drain():
    assert Shaping().tcp_rto_min_us == 200_000  # Linux's own
    assert Shaping(rate="20mbit").tcp_rto_min_us == 200_000  # 500 KB queue: 0.2 s
    assert Shaping(rate="2mbit").tcp_rto_min_us == 1_024_000  # 256 KB at 250 KB/s


def test_dead_switch_reported_by_health_monitor():
    with emulation("thlth", "star:2") as state:
        pid = state.switches["s0"]["pid"]
        events_path = state.run_dir / "events.jsonl"
        time.sleep(1.0)  # the monitor has taken its first look
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        deadline = killed + 10
        while time.monotonic() < deadline:
            downs = [e for e in read_events(events_path) if e["kind"] == "switch_down"]
            if downs:
                break
            time.sleep(0.1)
        assert downs, "no switch_down event within 10 s"
        assert downs[0]["switch"] == "s0"
        assert time.monotonic() - killed < 5.0
        ctl = subprocess.run([sys.executable, "-m", "control_plane.cli", "--fabric",
                              str(state.run_dir / "fabric.json"), "events"],
                             capture_output=True, text=True, timeout=30)
        assert "switch_down" in ctl.stdout and "s0" in ctl.stdout


def test_down_after_a_crash_removes_everything():
    """Kill the switch and leave the run dir as a crash would; down still cleans up."""
    with emulation("tcrsh", "star:2") as state:
        os.kill(state.switches["s0"]["pid"], signal.SIGKILL)
    assert net.leftovers("tcrsh") == []


def test_bcube32_comes_up_and_neighbours_ping():
    """The seed's testbed size: 9 servers, 6 switches; every neighbour pair on every level."""
    started = time.monotonic()
    with emulation("tbc32", "bcube:3,2") as state:
        up_seconds = time.monotonic() - started
        topo = state.topo()
        assert len(state.switches) == 6 and len(state.namespaces) == 9
        failures = [(s, p, level) for level in range(2) for s in range(9)
                    for p in topo.neighbours(s, level)
                    if not ping(state, s, topo.nics(p)[level].ip)]
        assert failures == []
        print(f"bcube:3,2 up in {up_seconds:.1f} s")
