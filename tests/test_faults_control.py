"""Faults injected with ``bml-net fail`` / ``restore`` on a running star:4, and the control
plane's own failure: jobs keep aggregating while the control plane is dead, a restarted one
attaches to the switches without resetting anything, a restarted switch is re-provisioned by
the health monitor, a NIC taken down and up again carries pushes again. On the software target
always, on BMv2 when it is installed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from bml.paths import REPO_ROOT
from bml.protocol import Stat
from bml.topology import Topology
from control_plane import health
from control_plane.admission import admission_entries
from control_plane.fabric import Fabric
from control_plane.fabric import create as create_fabric
from control_plane.forwarding import forwarding_entries
from control_plane.health import HealthMonitor
from control_plane.jobs import plan_job
from control_plane.p4info import Names
from control_plane.provision import install_group, provision_switch
from control_plane.session import SwitchError, SwitchSession
from control_plane.status import read_events
from emulation import net
from emulation.net import State
from emulation.workers import Push, PushResult, run_pushes
from hosts.quantize import check_sum
from soft_target.p4runtime_server import serve
from tests.conftest import NETNS_REASON, emulation, in_process_servicer

needs_netns = pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")

TARGETS = [
    "soft",
    pytest.param("bmv2", marks=pytest.mark.skipif(net.find_bmv2() is None,
                                                   reason=net.BMV2_MISSING)),
]
JOB = 7
WORKERS = [0, 1, 2, 3]


def bml_net(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulation.net", "--name", name, *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def bml_ctl(state: State, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "control_plane.cli", "--fabric",
                           str(state.run_dir / "fabric.json"), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(capsys, name: str, *args: str, message: str) -> None:
    """``bml-net`` (its ``main``, in this process: quicker) exits 2 with one clear line on
    stderr."""
    capsys.readouterr()
    code = net.main(["--name", name, *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("bml-net: error: "), err
    assert message in err, err


def push(state: State, tmp_path, seed: int, size: int) -> list[str]:
    """Every worker of the job pushes on eth0; the problems found (none: every sum right)."""
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(size).astype(np.float32) for _ in WORKERS]
    workdir = tmp_path / f"push{seed}"
    workdir.mkdir(exist_ok=True)
    results: list[PushResult] = run_pushes(
        state, JOB, [Push(s, s, g) for s, g in zip(WORKERS, grads, strict=True)],
        workdir, extra=["--timeout", "30"], timeout=90)
    problems = [f"push {seed}, h{s}: exit {r.returncode}: {r.stderr.strip()[-300:]}"
                for s, r in zip(WORKERS, results, strict=True) if r.returncode != 0]
    if not problems:
        for s, result in zip(WORKERS, results, strict=True):
            error, bound, within = check_sum(np.load(result.output), grads)
            if not within:
                problems.append(f"push {seed}, h{s}: error {error} beyond bound {bound}")
    return problems


def size_for(target: str) -> int:
    return 10000 if target == "soft" else 5000


def snapshot(state: State) -> tuple[list[int], dict[str, list[bytes]]]:
    return read_switch(state.switches["s0"]["address"])


def wait_event(state: State, kind: str, after: float, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in read_events(state.run_dir / "events.jsonl")
                 if e["kind"] == kind and e["time"] >= after]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {kind} event within {timeout} s: "
                         f"{read_events(state.run_dir / 'events.jsonl')}")


@pytest.mark.netns
@needs_netns
@pytest.mark.parametrize("target", TARGETS)
def test_controller_killed_during_pushes_then_restarted(tmp_path, capsys, target):
    name = f"fc{target[0]}"
    with emulation(name, "star:4", target=target) as state:
        Fabric.load(state.run_dir / "fabric.json").add_job(JOB, WORKERS)
        size = size_for(target)
        assert push(state, tmp_path, 0, size) == []
        stats_before, tables_before = snapshot(state)
        assert stats_before[Stat.COMPLETED] > 0  # the push went through the switch

        pushes_done, problems = [], []

        def loop() -> None:
            for seed in range(1, 6):
                problems.extend(push(state, tmp_path, seed, size))
                pushes_done.append(seed)

        worker = threading.Thread(target=loop)
        worker.start()
        try:
            while not pushes_done and worker.is_alive():
                time.sleep(0.05)
            monitor = net.monitor_pid(state)
            assert monitor
            out = ok(bml_net(name, "fail", "controller"))
            assert f"pid {monitor} killed" in out
            state = State.load(name)
            assert state.controller_failed and monitor not in state.pids
            assert not net._alive(monitor)
            assert "controller: FAILED" in ok(bml_net(name, "status"))
            refused(capsys, name, "fail", "controller", message="is not running")
            seen = len(pushes_done)
            while len(pushes_done) < seen + 2 and worker.is_alive():
                time.sleep(0.05)  # two whole pushes with no control plane at all
            out = ok(bml_net(name, "restore", "controller"))
            state = State.load(name)
            assert state.monitor_pid and state.monitor_pid in state.pids
            assert not state.controller_failed
            assert f"pid {state.monitor_pid}" in out
        finally:
            worker.join(timeout=300)
        assert problems == []
        assert pushes_done == list(range(1, 6))

        # The restarted control plane (monitor and bml-ctl) attached without resetting.
        for command in ("status", "counters", "jobs", "events"):
            ok(bml_ctl(state, command))
        time.sleep(1.5)  # the new monitor has looked at the switch at least twice
        stats_after, tables_after = snapshot(state)
        assert tables_after == tables_before  # no entry lost, added or re-written away
        assert stats_after[Stat.RESET] == stats_before[Stat.RESET]  # no slot was reset
        assert all(a >= b for a, b in zip(stats_after, stats_before, strict=True))
        assert stats_after[Stat.AGGREGATED] > stats_before[Stat.AGGREGATED]  # kept, grew
        assert [e for e in read_events(state.run_dir / "events.jsonl")
                if e["kind"] in ("switch_down", "reprovisioned")] == []
        assert net._alive(state.monitor_pid)
        assert push(state, tmp_path, 9, size) == []


@pytest.mark.netns
@needs_netns
@pytest.mark.parametrize("target", TARGETS)
def test_switch_killed_and_restored_is_reprovisioned(tmp_path, capsys, target):
    name = f"fs{target[0]}"
    with emulation(name, "star:4", target=target) as state:
        Fabric.load(state.run_dir / "fabric.json").add_job(JOB, WORKERS)
        size = size_for(target)
        assert push(state, tmp_path, 0, size) == []
        old_pid = state.switches["s0"]["pid"]
        time.sleep(0.6)  # the monitor has looked at the switch

        killed = time.time()
        assert f"pid {old_pid} killed" in ok(bml_net(name, "fail", "switch", "s0"))
        down = wait_event(state, "switch_down", killed, 10)
        state = State.load(name)
        assert state.failed_switches == ["s0"] and old_pid not in state.pids
        assert "switch s0: FAILED" in ok(bml_net(name, "status"))
        refused(capsys, name, "fail", "switch", "s0", message="already down")
        refused(capsys, name, "fail", "switch", "s9", message="no switch 's9'")

        time.sleep(0.5)
        restoring = time.time()
        ok(bml_net(name, "restore", "switch", "s0"))
        restored = time.time()
        up = wait_event(state, "switch_up", restoring, 15)
        done = wait_event(state, "reprovisioned", restoring, 30)
        print(f"\n{target}: switch_down {down['time'] - killed:.2f} s after the kill; "
              f"restart answering after {restored - restoring:.2f} s; switch_up "
              f"{up['time'] - restored:.2f} s and reprovisioned {done['time'] - restored:.2f} s "
              "after that")
        assert down["time"] - killed < 3.0  # period 0.5 s + timeout 1 s, with margin
        assert done["time"] - restored < 10.0
        state = State.load(name)
        new_pid = state.switches["s0"]["pid"]
        assert new_pid != old_pid and new_pid in state.pids and state.failed_switches == []
        refused(capsys, name, "restore", "switch", "s0", message="nothing to restore")
        events = ok(bml_ctl(state, "events"))
        for kind in ("switch_down", "switch_up", "reprovisioned"):
            assert kind in events
        assert "reprovision_failed" not in events
        assert push(state, tmp_path, 1, size) == []


@pytest.mark.netns
@needs_netns
@pytest.mark.parametrize("target", TARGETS)
def test_link_down_and_up_from_the_command_line(tmp_path, capsys, target):
    name = f"fl{target[0]}"
    with emulation(name, "star:4", target=target) as state:
        Fabric.load(state.run_dir / "fabric.json").add_job(JOB, WORKERS)
        size = size_for(target)
        assert "link h1:eth0 down" in ok(bml_net(name, "fail", "link", "h1", "eth0"))
        state = State.load(name)
        assert net.server_link_state(state, 1, "eth0") == "DOWN"
        assert net.netns.link_state(state.switch_interface(1, 2)) != "UP"  # lost carrier
        assert "link h1:eth0: FAILED" in ok(bml_net(name, "status"))
        refused(capsys, name, "fail", "link", "h1", "eth0", message="already down")
        refused(capsys, name, "fail", "link", "h7", "eth0", message="no server 'h7'")
        refused(capsys, name, "fail", "link", "h1", "eth1", message="has no NIC 'eth1'")
        refused(capsys, name, "restore", "link", "h2", "eth0", message="is not failed")

        assert "link h1:eth0 up" in ok(bml_net(name, "restore", "link", "h1", "eth0"))
        state = State.load(name)
        assert net.server_link_state(state, 1, "eth0") == "UP"
        assert state.failed_links == {}
        assert push(state, tmp_path, 0, size) == []

        # The switch's end, then shaping from the command line, on the running emulation.
        ok(bml_net(name, "fail", "link", "h2", "eth0", "--end", "switch"))
        assert net.netns.link_state(state.switch_interface(1, 3)) == "DOWN"
        assert net.server_link_state(state, 2, "eth0") != "UP"
        ok(bml_net(name, "restore", "link", "h2", "eth0"))
        out = ok(bml_net(name, "shape", "--loss", "1", "--reorder", "10"))
        assert "loss 1%" in out and "reorder 10%" in out
        assert State.load(name).shaping["loss"] == 1.0
        assert push(state, tmp_path, 1, size) == []
        assert "unimpaired" in ok(bml_net(name, "shape"))
    refused(capsys, name, "fail", "controller", message=f"no emulation named '{name}' is up")



def read_switch(address: str) -> tuple[list[int], dict[str, list[bytes]]]:
    """The switch's stats counter and every table's entries, read without a stream (no
    election id: reading disturbs no controller)."""
    session = SwitchSession("s0", address, 1, stream=False)
    try:
        tables = {name: sorted(e.SerializeToString(deterministic=True)
                               for e in session.read_table(name))
                  for name in session.p4info.tables}
        return session.read_counter(Names.STATS), tables
    finally:
        session.close()


def close(monitor: HealthMonitor) -> None:
    for session in monitor.sessions.values():
        if session is not None:
            session.close()


def test_monitor_provisions_a_bare_switch_retries_and_a_restarted_one_changes_nothing(
        tmp_path, monkeypatch):
    """In process, no namespaces. A monitor that starts and finds a switch without a pipeline
    (restarted while no monitor watched) provisions it with the fabric's jobs; an attempt that
    dies half-way is tried again, over what it left. A second monitor (the control plane
    restarted) finds the switch running and changes nothing."""
    server, port = serve(in_process_servicer(), "127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    topology = Topology.parse("star:4")
    fabric = create_fabric(tmp_path / "fabric.json", topology, {"s0": (address, 1)})
    fabric.jobs[str(JOB)] = plan_job(topology, JOB, WORKERS, pool_size=64).to_json()
    fabric.save()
    attempts: list[bool] = []
    install = health.install_group

    def dies_after_writing(session, switch, group, timeout=10.0, replace=False):
        attempts.append(replace)
        install(session, switch, group, timeout, replace)
        if len(attempts) == 1:  # written, then the attempt dies before it could say so
            raise TimeoutError("interrupted")

    monkeypatch.setattr(health, "install_group", dies_after_writing)
    events: list[dict] = []
    first = HealthMonitor(fabric, period=0.1, timeout=2.0, on_event=events.append)
    second = HealthMonitor(fabric, period=0.1, timeout=2.0, on_event=events.append)
    try:
        first.check("s0")
        assert [e["kind"] for e in events] == ["switch_up", "reprovision_failed"]
        assert "without a pipeline" in events[0]["detail"]
        first.check("s0")  # again, over the entries the first attempt wrote
        assert [e["kind"] for e in events][2:] == ["reprovisioned"]
        assert attempts == [True, True]
        first.check("s0")
        assert len(events) == 3  # provisioned: nothing more to do
        stats, tables = read_switch(address)
        assert stats[Stat.RESET] == 2 * 64
        assert len(tables[Names.WORKER_ADMISSION]) == len(WORKERS)

        close(first)  # the control plane dies; a new monitor attaches
        second.check("s0")
        second.check("s0")
        assert len(events) == 3
        assert read_switch(address) == (stats, tables)  # nothing re-pushed, re-written, reset
    finally:
        close(first)
        close(second)
        server.stop(0)


def bounded(call, seconds: float = 20.0):
    """Run ``call`` in a thread; fail (instead of hanging the suite) if it never returns."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("ok", call()))
        except BaseException as exc:
            outcome.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def test_interrupted_control_plane_writes_can_be_done_again(tmp_path):
    """In process: a job-add or job-remove killed half-way (its writes partly done, the fabric
    not saved) can simply be run again; batches where some updates succeed and others are
    refused end (p4runtime-shell's own error parser loops forever on them)."""
    server, port = serve(in_process_servicer(), "127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    topology = Topology.parse("star:4")
    switch = topology.switch("s0")
    fabric = create_fabric(tmp_path / "fabric.json", topology, {"s0": (address, 1)})
    session = SwitchSession("s0", address, 1, (0, 1))  # below the fabric's writer id
    try:
        fabric.provision()
        forwarding = forwarding_entries(topology, switch)
        session.write_entries(forwarding[:2], "DELETE")
        with pytest.raises(SwitchError) as refusal:  # 2 refused, 2 done: ends, names the 2
            bounded(lambda: session.write_entries(forwarding))
        assert str(refusal.value).startswith("switch s0 refused 2 of 4 writes")
        session.write_entries(forwarding[:1], "DELETE")
        bounded(lambda: provision_switch(session, topology, switch, replace=True))
        assert len(session.read_table(Names.L2_FORWARD)) == len(forwarding)

        group = plan_job(topology, JOB, WORKERS, pool_size=64).groups[0]
        install_group(session, switch, group)  # a job-add that died before saving the fabric
        bounded(lambda: fabric.add_job(JOB, WORKERS, pool_size=64))
        # A job-remove that died after deleting the multicast group and some entries, the
        # job's job_config among them (its slots can no longer be reset).
        session.set_multicast_group(group.mcast_group, [], kind="DELETE")
        session.write_entries(admission_entries(group)[:2], "DELETE")
        bounded(lambda: fabric.remove_job(JOB))
        assert session.read_table(Names.JOB_CONFIG) == []
        assert session.read_table(Names.WORKER_ADMISSION) == []
        bounded(lambda: fabric.add_job(JOB, WORKERS, pool_size=64))
        assert len(session.read_table(Names.WORKER_ADMISSION)) == len(WORKERS)
    finally:
        session.close()
        server.stop(0)
