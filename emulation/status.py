"""``bml-net status``: what a running emulation is made of, what of it is failed, and what its
switches counted."""

from __future__ import annotations

import re

from emulation import netns
from emulation.netns import Shaping
from emulation.processes import alive, monitor_pid
from emulation.state import State


def server_link_state(state: State, server: int, interface: str) -> str:
    """The server-side NIC's state as its namespace sees it (UP, DOWN, LOWERLAYERDOWN...)."""
    out = netns.run("ip", "-o", "link", "show", interface, namespace=state.namespace_of(server),
                    check=False)
    match = re.search(r"state (\S+)", out)
    return match.group(1) if match else "MISSING"


def fault_lines(state: State) -> list[str]:
    """What is failed now: injected faults, and processes that died on their own."""
    lines = []
    for name, sw in state.switches.items():
        if name in state.failed_switches:
            lines.append(f"  switch {name}: FAILED (killed by bml-net fail; "
                         f"`bml-net restore switch {name}`)")
        elif not alive(sw["pid"]):
            lines.append(f"  switch {name}: DOWN (pid {sw['pid']} is not running; "
                         f"`bml-net restore switch {name}`)")
    for key, end in state.failed_links.items():
        server, nic = key.split(":")
        lines.append(f"  link {key}: FAILED ({end} end down; "
                     f"`bml-net restore link {server} {nic}`)")
    if state.controller_failed:
        lines.append("  controller: FAILED (no health monitor; `bml-net restore controller`)")
    elif state.ready and (state.run_dir / "fabric.json").exists() and not monitor_pid(state):
        lines.append("  controller: DOWN (the health monitor is not running; "
                     "`bml-net restore controller`)")
    return ["faults:", *lines] if lines else ["faults: none"]


def status_lines(state: State) -> list[str]:
    """Switches (alive, P4Runtime address, port states), the controller, faults, then the
    switches' counters and the control plane's last events."""
    from control_plane.status import counter_table, event_lines

    lines = [f"emulation {state.name}: {state.topology} on {state.target}"
             + (f", shaping {state.shaping}" if Shaping(**state.shaping).active else "")]
    lines.append(f"{'switch':<8} {'device':>6} {'pid':>8} {'alive':<6} {'P4Runtime':<20} ports")
    for sw in state.switches.values():
        lines.append(f"{sw['name']:<8} {sw['device_id']:>6} {sw['pid']:>8} "
                     f"{'yes' if alive(sw['pid']) else 'NO':<6} {sw['address']:<20} "
                     + " ".join(f"{p}:{netns.link_state(i)}" for p, i in sw["ports"].items()))
    pid = monitor_pid(state)
    lines.append("controller: health monitor " + (f"pid {pid}" if pid else "NOT RUNNING"))
    lines += fault_lines(state)
    lines.append("")
    lines += counter_table(state.switch_addresses())
    lines.append("")
    lines += event_lines(state.run_dir / "events.jsonl", last=10)
    return lines
