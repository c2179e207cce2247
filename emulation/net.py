"""``bml-net``: bring an emulated BCube or star up on this machine, look at it, tear it down.

One network namespace per server (interfaces eth0..eth(k-1)), one switch process per BCube
switch (the software target, or simple_switch_grpc) on veth ends in the root namespace, tc
shaping where asked, then provisioning over P4Runtime. Everything made is written to
``<run dir>/state.json`` as it is made, so ``down`` can remove it even after a crash.

This module is the emulation's public face: its lifecycle (``up``, ``down``, ``leftovers``)
is defined here, and the parts it is built from are re-exported, so that tests, benchmarks and
training import one module whatever the layout behind it: ``state`` (the saved record),
``build`` (namespaces, links, shaping), ``processes`` (switch processes, the health monitor,
ending a process by PID), ``faults`` (fail and restore), ``status`` and ``cli``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

from bml.protocol import BUILT_LANES, DEFAULT_LANES
from bml.topology import Topology
from control_plane.fabric import create as create_fabric
from emulation import faults, netns
from emulation.build import add_detour_routes, add_neighbours, build, reshape
from emulation.faults import (
    LINK_ENDS,
    fail_controller,
    fail_link,
    fail_switch,
    restore_controller,
    restore_link,
)
from emulation.netns import NetError, Shaping
from emulation.processes import (
    BMV2_MISSING,
    alive,
    free_tcp_port,
    monitor_pid,
    start_monitor,
    start_switch_process,
    stop_pid,
    switch_command,
    wait_for_port,
)
from emulation.state import RUN_ROOT, State, SwitchProcess
from emulation.status import fault_lines, server_link_state, status_lines

__all__ = [
    "BMV2_MISSING", "BMV2_SEARCH", "LINK_ENDS", "RUN_ROOT", "SERVERS_PER_CORE",
    "SWITCHES_PER_CORE", "NetError", "Shaping", "State", "SwitchProcess", "add_detour_routes",
    "add_neighbours", "check_request", "down", "fail_controller", "fail_link", "fail_switch",
    "fault_lines", "find_bmv2", "free_tcp_port", "leftovers", "main", "monitor_pid", "reshape",
    "restore_controller", "restore_link", "restore_switch", "server_link_state",
    "start_switch_process", "status_lines", "stop_pid", "switch_command", "up",
    "validate_name", "wait_for_port",
]

SERVERS_PER_CORE = 16
SWITCHES_PER_CORE = 8
BMV2_SEARCH = ("/opt/bmv2/bin", "/usr/local/bin", "/usr/bin")

# Callers outside emulation/ (tests, tools) ask this module whether a PID still runs.
_alive = alive


def find_bmv2(explicit: str | None = None) -> str | None:
    """simple_switch_grpc: $BMV2_SWITCH, then PATH, then the usual install prefixes.

    Defined here, beside ``up`` and ``restore_switch`` (the two that start BMv2), so that
    replacing ``BMV2_SEARCH`` here changes where all of them look."""
    candidates = [explicit, os.environ.get("BMV2_SWITCH"), shutil.which("simple_switch_grpc")]
    candidates += [f"{d}/simple_switch_grpc" for d in BMV2_SEARCH]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def validate_name(name: str) -> str:
    """The name tags every namespace and link made; short enough for interface names (15
    characters) and matched by ``netns.tag_patterns`` without catching another's."""
    if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", name):
        raise NetError(f"bad emulation name {name!r}: 1-6 lower-case letters or digits, "
                       "starting with a letter")
    return name


def check_request(topology: Topology, target: str, bmv2: str | None) -> None:
    """Every reason to refuse, before anything is created."""
    if os.geteuid() != 0:
        raise NetError("bml-net needs root (network namespaces)")
    netns.require_tools()
    cores = os.cpu_count() or 1
    if topology.num_servers > SERVERS_PER_CORE * cores:
        raise NetError(f"{topology.spec} has {topology.num_servers} servers; this machine "
                       f"({cores} cores) holds at most {SERVERS_PER_CORE * cores}")
    if topology.num_switches > SWITCHES_PER_CORE * cores:
        raise NetError(f"{topology.spec} has {topology.num_switches} switches; this machine "
                       f"({cores} cores) runs at most {SWITCHES_PER_CORE * cores}")
    if target == "bmv2" and bmv2 is None:
        raise NetError("--target bmv2 asked for, but simple_switch_grpc is not installed "
                       "(set BMV2_SWITCH or put it on PATH)")
    if target not in ("soft", "bmv2"):
        raise NetError(f"unknown target {target!r}: soft or bmv2")


def up(name: str, spec: str, target: str = "soft", shaping: Shaping | None = None,
       bmv2: str | None = None, provision: bool = True, lanes: int = DEFAULT_LANES) -> State:
    """Create the emulation, its switches given the ``lanes``-wide P4 build; on any failure,
    remove what was made and re-raise."""
    if lanes not in BUILT_LANES:
        raise NetError(f"--lanes {lanes}: p4src/build holds {', '.join(map(str, BUILT_LANES))}")
    validate_name(name)
    topology = Topology.parse(spec)
    shaping = shaping or Shaping()
    bmv2 = find_bmv2(bmv2) if target == "bmv2" else None
    check_request(topology, target, bmv2)
    shaping.check()  # refuses impossible shaping before anything exists
    if State.path(name).exists():
        raise NetError(f"emulation {name!r} is already up: run `bml-net down --name {name}`")
    state = State(name, topology.spec, target, shaping.__dict__)
    state.save()
    try:
        build(state, topology, shaping, target, bmv2)
        fabric = create_fabric(state.run_dir / "fabric.json", topology, state.switch_addresses(),
                               lanes)
        if provision:
            fabric.provision()
            start_monitor(state)
        state.ready = True
        state.save()
    except BaseException:
        down(name)
        raise
    return state


def down(name: str) -> list[str]:
    """Remove everything the emulation made; safe to call on a half-built or crashed one."""
    validate_name(name)
    removed = []
    state = State.read(name)
    if state is not None:
        for pid in state.pids:
            stop_pid(pid)
            removed.append(f"pid {pid}")
        for namespace in state.namespaces:
            netns.delete_namespace(namespace)
            removed.append(f"netns {namespace}")
        for link in state.links:
            netns.delete_link(link)
    removed += netns.sweep(name)
    shutil.rmtree(RUN_ROOT / name, ignore_errors=True)
    return removed


def leftovers(name: str) -> list[str]:
    """What of this emulation still exists (empty after a clean ``down``)."""
    found = netns.leftovers(name)
    state = State.read(name)
    if state is not None:
        found += [f"pid {pid}" for pid in state.pids if alive(pid)]
        found.append(f"run dir {state.run_dir}")
    return found


def restore_switch(state: State, name: str, bmv2: str | None = None,
                   timeout: float = 30) -> int:
    """Start a failed switch again, without a pipeline (``faults.restore_switch``), with
    BMv2 found as ``up`` finds it. Returns the PID."""
    binary = find_bmv2(bmv2) if state.target == "bmv2" else None
    return faults.restore_switch(state, name, binary, timeout)


def main(argv: list[str] | None = None) -> int:
    """``bml-net``'s command line (``emulation.cli``), here too for ``python -m
    emulation.net``; imported when called, as the CLI itself builds on this module."""
    from emulation.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
