"""The emulation's processes: switch processes, the control plane's health monitor, and the one
way they end.

Processes are started in sessions of their own and recorded by PID in the state, and they are
ended by that PID only (``stop_pid``), never by name: another emulation, test or user on this
machine may run processes of the same name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bml.paths import REPO_ROOT
from emulation.netns import NetError
from emulation.state import State

BMV2_MISSING = ("simple_switch_grpc is not installed (BMv2 is in no package registry; set "
                "BMV2_SWITCH to a local build to run this)")


def free_tcp_port() -> int:
    """A port nothing listens on now (the kernel's choice), for a P4Runtime or Thrift server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def switch_command(target: str, bmv2: str | None, device_id: int, ports: dict[int, str],
                   address: str) -> list[str]:
    """The command line of one switch: the software target, or BMv2 started without a
    pipeline (provisioning sets it over P4Runtime, as for the software target)."""
    interfaces = [arg for port, name in sorted(ports.items()) for arg in ("-i", f"{port}@{name}")]
    if target == "soft":
        return [sys.executable, "-m", "soft_target.switch", "--device-id", str(device_id),
                *interfaces, "--grpc-server-addr", address]
    return [bmv2, "--device-id", str(device_id), *interfaces, "--no-p4",
            "--thrift-port", str(free_tcp_port()), "--",
            "--grpc-server-addr", address, "--cpu-port", "510"]


def start_switch_process(target: str, bmv2: str | None, device_id: int, ports: dict,
                         address: str, log: str, mode: str = "wb") -> int:
    """Start one switch process in a session of its own, logging to ``log``; its PID."""
    ports = {int(port): name for port, name in ports.items()}  # JSON made the keys strings
    with open(log, mode) as out:
        process = subprocess.Popen(
            switch_command(target, bmv2, device_id, ports, address),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT, start_new_session=True)
    return process.pid


def wait_for_port(address: str, pid: int, timeout: float, log: str) -> None:
    """Until the switch ``pid`` accepts connections at ``address``; a switch that exits first
    is an error with its log's tail, so a bad start is reported, not waited out."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            tail = Path(log).read_text()[-800:] if Path(log).exists() else ""
            raise NetError(f"switch process {pid} exited at start:\n{tail}") from None
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.05)
    raise NetError(f"switch process {pid} did not listen on {address} within {timeout} s")


def start_monitor(state: State) -> None:
    """The control plane's health monitor, for as long as the emulation is up."""
    log = state.run_dir / "monitor.log"
    with open(log, "ab") as out:  # a restarted monitor appends
        process = subprocess.Popen(
            [sys.executable, "-m", "control_plane.cli", "--fabric",
             str(state.run_dir / "fabric.json"), "monitor"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
            start_new_session=True)
    state.pids.append(process.pid)
    state.monitor_pid = process.pid
    state.save()


def monitor_pid(state: State) -> int:
    """The health monitor's PID (0 if none runs). States written before ``monitor_pid``
    existed: the one PID that is no switch's."""
    if state.monitor_pid:
        return state.monitor_pid if alive(state.monitor_pid) else 0
    switch_pids = {sw["pid"] for sw in state.switches.values()}
    others = [pid for pid in state.pids if pid not in switch_pids and alive(pid)]
    return others[0] if len(others) == 1 else 0


def alive(pid: int) -> bool:
    """Whether the process runs; a zombie does not count (one of ours is reaped here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0): reap it if it is our child.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"


def stop_pid(pid: int, timeout: float = 5.0, first: int = signal.SIGTERM) -> None:
    """End one of our own processes by its PID: ``first`` (SIGTERM lets it clean up; SIGKILL
    is a crash, as fault injection wants), SIGKILL if it still runs after ``timeout``, then
    wait (bounded by ``timeout`` again) until it is gone, so that what it held is free."""
    if not alive(pid):
        return
    for sig in dict.fromkeys((first, signal.SIGKILL)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.02)
