"""``bml-net fail ...`` / ``bml-net restore ...``: faults injected into a running emulation.

Each records what it did in the state (so ``status`` shows it and ``down`` still removes
everything) and keeps ``state.pids`` to the processes that run: a killed one leaves it, a
restarted one joins.
"""

from __future__ import annotations

import signal
import time

from emulation import netns
from emulation.build import add_detour_routes, add_neighbours
from emulation.netns import NetError
from emulation.processes import (
    BMV2_MISSING,
    alive,
    monitor_pid,
    start_monitor,
    start_switch_process,
    stop_pid,
    wait_for_port,
)
from emulation.state import State

LINK_ENDS = ("server", "switch", "both")


def _switch(state: State, name: str) -> dict:
    if name not in state.switches:
        raise NetError(f"no switch {name!r} in {state.topology} "
                       f"({', '.join(state.switches)})")
    return state.switches[name]


def fail_switch(state: State, name: str) -> int:
    """Kill a switch's process (SIGKILL, as a crash); returns the PID killed."""
    sw = _switch(state, name)
    pid = sw["pid"]
    if not alive(pid):
        raise NetError(f"switch {name} is already down (pid {pid} is not running)")
    stop_pid(pid, first=signal.SIGKILL)
    if pid in state.pids:
        state.pids.remove(pid)
    if name not in state.failed_switches:
        state.failed_switches.append(name)
    state.save()
    return pid


def restore_switch(state: State, name: str, bmv2: str | None, timeout: float = 30) -> int:
    """Start a switch again with its ports, target, device id and P4Runtime address, without
    a pipeline (as a rebooted switch); the health monitor re-provisions it. ``bmv2`` is the
    BMv2 binary already found (``emulation.net.restore_switch`` finds it). Returns the PID."""
    sw = _switch(state, name)
    if alive(sw["pid"]):
        raise NetError(f"switch {name} is running (pid {sw['pid']}): nothing to restore")
    if state.target == "bmv2" and bmv2 is None:
        raise NetError(BMV2_MISSING)
    with open(sw["log"], "ab") as log:
        log.write(f"\n--- restarted by bml-net restore at {time.ctime()} ---\n".encode())
    if sw["pid"] in state.pids:
        state.pids.remove(sw["pid"])
    pid = start_switch_process(state.target, bmv2, sw["device_id"], sw["ports"],
                               sw["address"], sw["log"], "ab")
    sw["pid"] = pid
    state.pids.append(pid)
    state.save()
    wait_for_port(sw["address"], pid, timeout, sw["log"])
    if name in state.failed_switches:
        state.failed_switches.remove(name)
    state.save()
    return pid


def fail_controller(state: State) -> int:
    """Kill the control plane's health monitor (SIGKILL); returns its PID."""
    pid = monitor_pid(state)
    if not pid:
        raise NetError(f"the control plane of {state.name} is not running (no monitor process)")
    stop_pid(pid, first=signal.SIGKILL)
    if pid in state.pids:
        state.pids.remove(pid)
    state.monitor_pid = 0
    state.controller_failed = True
    state.save()
    return pid


def restore_controller(state: State) -> int:
    """Start the health monitor again; it attaches to the running switches as they are."""
    pid = monitor_pid(state)
    if pid:
        raise NetError(f"the control plane of {state.name} is running (monitor pid {pid}): "
                       "nothing to restore")
    if not (state.run_dir / "fabric.json").exists():
        raise NetError(f"{state.name} has no fabric (brought up without provisioning)")
    start_monitor(state)
    state.controller_failed = False
    state.save()
    return state.monitor_pid


def _nic(state: State, server: str, interface: str) -> tuple[int, str, str]:
    """(server index, its NIC, the switch-side veth end of that NIC's link)."""
    index = state.server_index(server)
    topology = state.topo()
    nics = {nic.interface: nic for nic in topology.nics(index)}
    if interface not in nics:
        raise NetError(f"server h{index} has no NIC {interface!r} ({', '.join(nics)})")
    nic = nics[interface]
    device_id = topology.switch(nic.switch).device_id
    return index, interface, state.switch_interface(device_id, nic.port)


def fail_link(state: State, server: str, interface: str, end: str = "server") -> str:
    """Take a link down: the server's NIC in its namespace (``server``), the switch's veth end
    (``switch``: the NIC loses its carrier) or both. Returns the link's name "hX:ethL"."""
    if end not in LINK_ENDS:
        raise NetError(f"unknown link end {end!r}: {', '.join(LINK_ENDS)}")
    index, nic, switch_side = _nic(state, server, interface)
    key = f"h{index}:{nic}"
    if key in state.failed_links:
        raise NetError(f"link {key} is already down ({state.failed_links[key]} end)")
    if end in ("server", "both"):
        netns.run("ip", "link", "set", nic, "down", namespace=state.namespace_of(index))
    if end in ("switch", "both"):
        netns.run("ip", "link", "set", switch_side, "down")
    state.failed_links[key] = end
    state.save()
    return key


def restore_link(state: State, server: str, interface: str) -> str:
    """Bring a failed link up again, and the server's static neighbours on it back (taking an
    interface down flushes them)."""
    index, nic, switch_side = _nic(state, server, interface)
    key = f"h{index}:{nic}"
    if key not in state.failed_links:
        raise NetError(f"link {key} is not failed (failed: "
                       f"{', '.join(state.failed_links) or 'none'})")
    end = state.failed_links[key]
    if end in ("switch", "both"):
        netns.run("ip", "link", "set", switch_side, "up")
    if end in ("server", "both"):
        netns.run("ip", "link", "set", nic, "up", namespace=state.namespace_of(index))
    topology = state.topo()
    level = int(nic.removeprefix("eth"))
    add_neighbours(state, topology, topology.switch(topology.nics(index)[level].switch), index)
    add_detour_routes(state, topology, index)
    del state.failed_links[key]
    state.save()
    return key
