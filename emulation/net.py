"""``bml-net``: bring an emulated BCube or star up on this machine, look at it, tear it down.

One network namespace per server (interfaces eth0..eth(k-1)), one switch process per BCube
switch (the software target, or simple_switch_grpc) on veth ends in the root namespace, tc
shaping where asked, then provisioning over P4Runtime. Everything made is written to
``<run dir>/state.json`` as it is made, so ``down`` can remove it even after a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bml.topology import Switch, Topology, TopologyError
from control_plane.fabric import create as create_fabric
from control_plane.p4info import REPO_ROOT
from emulation import netns
from emulation.netns import NetError, Shaping

RUN_ROOT = Path(os.environ.get("BML_RUN_ROOT", "/tmp/bml-net"))
SERVERS_PER_CORE = 16
SWITCHES_PER_CORE = 8
BMV2_SEARCH = ("/opt/bmv2/bin", "/usr/local/bin", "/usr/bin")


BMV2_MISSING = ("simple_switch_grpc is not installed (BMv2 is in no package registry; set "
                "BMV2_SWITCH to a local build to run this)")


def find_bmv2(explicit: str | None = None) -> str | None:
    """simple_switch_grpc: $BMV2_SWITCH, then PATH, then the usual install prefixes."""
    candidates = [explicit, os.environ.get("BMV2_SWITCH"), shutil.which("simple_switch_grpc")]
    candidates += [f"{d}/simple_switch_grpc" for d in BMV2_SEARCH]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class SwitchProcess:
    name: str
    device_id: int
    address: str
    pid: int
    ports: dict[int, str]
    log: str


@dataclass
class State:
    """What one emulation made; written after every step."""

    name: str
    topology: str
    target: str
    shaping: dict = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    switches: dict[str, dict] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    jobs: dict[str, dict] = field(default_factory=dict)
    ready: bool = False
    monitor_pid: int = 0  # the control plane's health monitor (0: not running)
    # Faults injected by `bml-net fail` and not yet restored: switch names, the controller,
    # and links as "hX:ethL" -> which end is down ("server", "switch" or "both").
    failed_switches: list[str] = field(default_factory=list)
    failed_links: dict[str, str] = field(default_factory=dict)
    controller_failed: bool = False

    @property
    def tag(self) -> str:
        return self.name

    @property
    def run_dir(self) -> Path:
        return RUN_ROOT / self.name

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.__dict__, indent=1, sort_keys=True))
        tmp.replace(self.run_dir / "state.json")

    @classmethod
    def load(cls, name: str) -> State:
        path = RUN_ROOT / name / "state.json"
        if not path.exists():
            raise NetError(f"no emulation named {name!r} is up (no {path})")
        return cls(**json.loads(path.read_text()))

    def topo(self) -> Topology:
        return Topology.parse(self.topology)

    def namespace_of(self, server: int) -> str:
        return f"{self.tag}-h{server}"

    def switch_interface(self, device_id: int, port: int) -> str:
        """The switch-side veth end of a port (netns.tag_patterns matches these names)."""
        return f"{self.tag}{device_id}p{port}"

    def switch_addresses(self) -> dict[str, tuple[str, int]]:
        return {name: (sw["address"], sw["device_id"]) for name, sw in self.switches.items()}


def validate_name(name: str) -> str:
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


def switch_command(target: str, bmv2: str | None, device_id: int, ports: dict[int, str],
                   address: str) -> list[str]:
    interfaces = [arg for port, name in sorted(ports.items()) for arg in ("-i", f"{port}@{name}")]
    if target == "soft":
        return [sys.executable, "-m", "soft_target.switch", "--device-id", str(device_id),
                *interfaces, "--grpc-server-addr", address]
    return [bmv2, "--device-id", str(device_id), *interfaces, "--no-p4",
            "--thrift-port", str(free_tcp_port()), "--",
            "--grpc-server-addr", address, "--cpu-port", "510"]


def wait_for_port(address: str, pid: int, timeout: float, log: str) -> None:
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


def up(name: str, spec: str, target: str = "soft", shaping: Shaping | None = None,
       bmv2: str | None = None, provision: bool = True) -> State:
    """Create the emulation; on any failure, remove what was made and re-raise."""
    validate_name(name)
    topology = Topology.parse(spec)
    shaping = shaping or Shaping()
    bmv2 = find_bmv2(bmv2) if target == "bmv2" else None
    check_request(topology, target, bmv2)
    shaping.check()  # refuses impossible shaping before anything exists
    if (RUN_ROOT / name / "state.json").exists():
        raise NetError(f"emulation {name!r} is already up: run `bml-net down --name {name}`")
    state = State(name, topology.spec, target, shaping.__dict__)
    state.save()
    try:
        _build(state, topology, shaping, target, bmv2)
        fabric = create_fabric(state.run_dir / "fabric.json", topology, state.switch_addresses())
        if provision:
            fabric.provision()
            _start_monitor(state)
        state.ready = True
        state.save()
    except BaseException:
        down(name)
        raise
    return state


def _build(state: State, topology: Topology, shaping: Shaping, target: str,
           bmv2: str | None) -> None:
    for server in range(topology.num_servers):
        namespace = state.namespace_of(server)
        netns.add_namespace(namespace)
        state.namespaces.append(namespace)
        state.save()
    for sw in topology.switches:
        ports = {}
        for port, server in zip(sw.ports, sw.servers, strict=True):
            nic = topology.nics(server)[sw.level]
            switch_side = state.switch_interface(sw.device_id, port)
            netns.add_link(switch_side, f"{state.tag}x{sw.device_id}p{port}",
                           state.namespace_of(server), nic.interface, nic.mac, f"{nic.ip}/16")
            state.links.append(switch_side)
            state.save()
            if shaping.active:
                netns.shape_link(switch_side, nic.interface, state.namespace_of(server), shaping)
            ports[port] = switch_side
        for server in sw.servers:
            add_neighbours(state, topology, sw, server)
        address = f"127.0.0.1:{free_tcp_port()}"
        log = str(state.run_dir / f"{sw.name}.log")
        pid = start_switch_process(target, bmv2, sw.device_id, ports, address, log, "wb")
        state.pids.append(pid)
        state.switches[sw.name] = SwitchProcess(sw.name, sw.device_id, address, pid,
                                                ports, log).__dict__
        state.save()
    for server in range(topology.num_servers):
        add_detour_routes(state, topology, server)
    for sw in state.switches.values():
        wait_for_port(sw["address"], sw["pid"], 30, sw["log"])


def add_neighbours(state: State, topology: Topology, sw: Switch, server: int) -> None:
    """The server's static neighbours on its NIC to ``sw``: the switch and the switch's other
    servers (nobody answers ARP here). Also after the NIC was down: that flushes them."""
    nic = topology.nics(server)[sw.level]
    namespace = state.namespace_of(server)
    netns.add_neighbour(namespace, nic.interface, sw.ip, sw.mac)
    for other in sw.servers:
        if other != server:
            peer = topology.nics(other)[sw.level]
            netns.add_neighbour(namespace, nic.interface, peer.ip, peer.mac)


def add_detour_routes(state: State, topology: Topology, server: int) -> None:
    """The host routes that carry a failed switch's group over the other levels through relay
    servers (``Topology.detour_routes``), with forwarding on so that this server relays. Also
    after one of its NICs was down: that removed the routes through it."""
    namespace = state.namespace_of(server)
    routes = topology.detour_routes(server)
    if not routes:
        return
    netns.run("sysctl", "-qw", "net.ipv4.ip_forward=1", namespace=namespace)
    netns.run("ip", "-batch", "-", namespace=namespace, stdin="".join(
        f"route replace {destination}/32 via {gateway} dev {interface}\n"
        for destination, gateway, interface in routes))


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


def reshape(state: State, shaping: Shaping) -> None:
    """Change the shaping of every link of a running emulation (both directions)."""
    shaping.check()
    topology = state.topo()
    for sw in topology.switches:
        for port, server in zip(sw.ports, sw.servers, strict=True):
            netns.shape_link(state.switch_interface(sw.device_id, port),
                             topology.nics(server)[sw.level].interface,
                             state.namespace_of(server), shaping)
    state.shaping = shaping.__dict__
    state.save()


def _start_monitor(state: State) -> None:
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0): reap it if it is ours.
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


def stop_pid(pid: int, timeout: float = 5.0) -> None:
    """End one of our own processes: SIGTERM, then SIGKILL after ``timeout``."""
    if not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def down(name: str) -> list[str]:
    """Remove everything the emulation made; safe to call on a half-built or crashed one."""
    validate_name(name)
    removed = []
    path = RUN_ROOT / name / "state.json"
    if path.exists():
        state = State(**json.loads(path.read_text()))
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
    path = RUN_ROOT / name / "state.json"
    if path.exists():
        state = State(**json.loads(path.read_text()))
        found += [f"pid {pid}" for pid in state.pids if _alive(pid)]
        found.append(f"run dir {path.parent}")
    return found


# ----------------------------------------------------------------------------- faults
# `bml-net fail ...` / `bml-net restore ...` on a running emulation. Each records what it did
# in the state (so `status` shows it and `down` still removes everything) and keeps
# ``state.pids`` to the processes that run: a killed one leaves it, a restarted one joins.

LINK_ENDS = ("server", "switch", "both")


def _kill(pid: int, timeout: float = 5.0) -> None:
    """SIGKILL one of our processes by its PID and wait (bounded) until it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _switch(state: State, name: str) -> dict:
    if name not in state.switches:
        raise NetError(f"no switch {name!r} in {state.topology} "
                       f"({', '.join(state.switches)})")
    return state.switches[name]


def fail_switch(state: State, name: str) -> int:
    """Kill a switch's process (SIGKILL, as a crash); returns the PID killed."""
    sw = _switch(state, name)
    pid = sw["pid"]
    if not _alive(pid):
        raise NetError(f"switch {name} is already down (pid {pid} is not running)")
    _kill(pid)
    if pid in state.pids:
        state.pids.remove(pid)
    if name not in state.failed_switches:
        state.failed_switches.append(name)
    state.save()
    return pid


def restore_switch(state: State, name: str, bmv2: str | None = None,
                   timeout: float = 30) -> int:
    """Start a switch again with its ports, target, device id and P4Runtime address, without
    a pipeline (as a rebooted switch); the health monitor re-provisions it. Returns the PID."""
    sw = _switch(state, name)
    if _alive(sw["pid"]):
        raise NetError(f"switch {name} is running (pid {sw['pid']}): nothing to restore")
    bmv2 = find_bmv2(bmv2) if state.target == "bmv2" else None
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


def monitor_pid(state: State) -> int:
    """The health monitor's PID (0 if none runs). States written before ``monitor_pid``
    existed: the one PID that is no switch's."""
    if state.monitor_pid:
        return state.monitor_pid if _alive(state.monitor_pid) else 0
    switch_pids = {sw["pid"] for sw in state.switches.values()}
    others = [pid for pid in state.pids if pid not in switch_pids and _alive(pid)]
    return others[0] if len(others) == 1 else 0


def fail_controller(state: State) -> int:
    """Kill the control plane's health monitor (SIGKILL); returns its PID."""
    pid = monitor_pid(state)
    if not pid:
        raise NetError(f"the control plane of {state.name} is not running (no monitor process)")
    _kill(pid)
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
    _start_monitor(state)
    state.controller_failed = False
    state.save()
    return state.monitor_pid


def _nic(state: State, server: str, interface: str) -> tuple[int, str, str]:
    """(server index, its NIC, the switch-side veth end of that NIC's link)."""
    topology = state.topo()
    index = int(server.lstrip("h")) if server.lstrip("h").isdigit() else -1
    if not 0 <= index < topology.num_servers:
        raise NetError(f"no server {server!r} in {state.topology} "
                       f"(h0..h{topology.num_servers - 1})")
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
        elif not _alive(sw["pid"]):
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


def exec_in(state: State, server: str, command: list[str]) -> int:
    index = int(server.lstrip("h")) if server.lstrip("h").isdigit() else -1
    if not 0 <= index < state.topo().num_servers:
        raise NetError(f"no server {server!r} in {state.topology} "
                       f"(h0..h{state.topo().num_servers - 1})")
    if not command:
        raise NetError("nothing to run: bml-net exec SERVER -- CMD ...")
    return subprocess.call(["ip", "netns", "exec", state.namespace_of(index), *command])


def status_lines(state: State) -> list[str]:
    from control_plane.status import counter_table, event_lines

    lines = [f"emulation {state.name}: {state.topology} on {state.target}"
             + (f", shaping {state.shaping}" if Shaping(**state.shaping).active else "")]
    lines.append(f"{'switch':<8} {'device':>6} {'pid':>8} {'alive':<6} {'P4Runtime':<20} ports")
    for sw in state.switches.values():
        lines.append(f"{sw['name']:<8} {sw['device_id']:>6} {sw['pid']:>8} "
                     f"{'yes' if _alive(sw['pid']) else 'NO':<6} {sw['address']:<20} "
                     + " ".join(f"{p}:{netns.link_state(i)}" for p, i in sw["ports"].items()))
    pid = monitor_pid(state)
    lines.append("controller: health monitor " + (f"pid {pid}" if pid else "NOT RUNNING"))
    lines += fault_lines(state)
    lines.append("")
    lines += counter_table(state.switch_addresses())
    lines.append("")
    lines += event_lines(state.run_dir / "events.jsonl", last=10)
    return lines


def add_shaping_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", help="rate per link and direction (tc tbf), e.g. 100mbit")
    parser.add_argument("--delay", help="delay per direction (tc netem), e.g. 1ms")
    parser.add_argument("--loss", type=float, default=0.0,
                        help="loss in percent per direction (nftables)")
    parser.add_argument("--reorder", type=float, default=0.0,
                        help="percent of each server's packets sent through a slower detour, "
                             "so they arrive after later ones (nftables + tbf)")


def describe_shaping(shaping: Shaping) -> str:
    parts = [f"rate {shaping.rate}" if shaping.rate else "",
             f"delay {shaping.delay}" if shaping.delay else "",
             f"loss {shaping.loss:g}%" if shaping.loss else "",
             f"reorder {shaping.reorder:g}%" if shaping.reorder else ""]
    return ", ".join(p for p in parts if p) or "unimpaired (no rate limit, delay, loss or " \
        "reordering)"


def inject(state: State, args: argparse.Namespace) -> str:
    """``bml-net fail|restore switch|link|controller``: do it, say what was done."""
    if not state.ready:
        raise NetError(f"emulation {state.name} is not up (still coming up, or failed to)")
    if args.command == "fail" and args.what == "switch":
        pid = fail_switch(state, args.switch)
        return (f"bml-net: switch {args.switch} failed: pid {pid} killed (SIGKILL); "
                f"`bml-net restore switch {args.switch}` starts it again")
    if args.what == "switch":
        started = time.monotonic()
        pid = restore_switch(state, args.switch, args.bmv2)
        return (f"bml-net: switch {args.switch} restored: pid {pid}, P4Runtime at "
                f"{state.switches[args.switch]['address']} answering after "
                f"{time.monotonic() - started:.1f} s, no pipeline yet (the health monitor "
                "re-provisions it)")
    if args.command == "fail" and args.what == "link":
        key = fail_link(state, args.server, args.interface, args.end)
        return f"bml-net: link {key} down ({args.end} end)"
    if args.what == "link":
        key = restore_link(state, args.server, args.interface)
        return f"bml-net: link {key} up again, its static neighbours restored"
    if args.command == "fail":
        pid = fail_controller(state)
        return (f"bml-net: controller failed: health monitor pid {pid} killed (SIGKILL); "
                "installed jobs keep running on the switches")
    pid = restore_controller(state)
    return (f"bml-net: controller restored: health monitor pid {pid}, attached to the running "
            "switches without resetting them")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bml-net", description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="bml", help="emulation name (1-6 chars; default bml)")
    commands = parser.add_subparsers(dest="command", required=True)
    p_up = commands.add_parser("up", help="create namespaces, links, switches; provision")
    p_up.add_argument("--topo", required=True, help="star:N or bcube:n,k")
    p_up.add_argument("--target", default="soft", help="soft (default) or bmv2")
    p_up.add_argument("--bmv2", help="path of simple_switch_grpc")
    add_shaping_arguments(p_up)
    commands.add_parser("status", help="switches, links, faults and counters")
    p_exec = commands.add_parser("exec", help="run a command on a server: exec h0 -- CMD")
    p_exec.add_argument("server")
    p_exec.add_argument("cmd", nargs=argparse.REMAINDER)
    commands.add_parser("down", help="remove everything this emulation made")
    p_shape = commands.add_parser("shape", help="re-shape every link of the running emulation "
                                  "(replaces the shaping it had; no option: unimpaired)")
    add_shaping_arguments(p_shape)
    for verb, text in (("fail", "inject a fault into the running emulation"),
                       ("restore", "undo a fault")):
        p_verb = commands.add_parser(verb, help=f"{text}: switch NAME | link hX ethL | "
                                     "controller")
        what = p_verb.add_subparsers(dest="what", required=True)
        p_switch = what.add_parser("switch", help="kill the switch's process (SIGKILL)"
                                   if verb == "fail" else "start the switch again, no pipeline "
                                   "(the health monitor re-provisions it)")
        p_switch.add_argument("switch", help="e.g. s0, s0_1")
        if verb == "restore":
            p_switch.add_argument("--bmv2", help="path of simple_switch_grpc")
        p_link = what.add_parser("link", help="take a server's NIC down (ip link)"
                                 if verb == "fail" else "bring the NIC up again")
        p_link.add_argument("server", help="e.g. h1")
        p_link.add_argument("interface", help="the server's NIC, e.g. eth0")
        if verb == "fail":
            p_link.add_argument("--end", choices=LINK_ENDS, default="server",
                                help="server: the NIC in the server's namespace (default); "
                                     "switch: the switch's veth end (the NIC loses carrier); "
                                     "both")
        what.add_parser("controller", help="kill the control plane's health monitor"
                        if verb == "fail" else "start the health monitor again")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            t0 = time.monotonic()
            state = up(args.name, args.topo, args.target,
                       Shaping(args.rate, args.delay, args.loss, args.reorder), args.bmv2)
            topo = state.topo()
            print(f"bml-net: {state.topology} up on {state.target} in "
                  f"{time.monotonic() - t0:.1f} s: {topo.num_servers} servers "
                  f"({state.namespace_of(0)}..), {topo.num_switches} switches, "
                  f"{len(state.links)} links; run dir {state.run_dir}")
        elif args.command == "status":
            print("\n".join(status_lines(State.load(args.name))))
        elif args.command == "exec":
            command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            return exec_in(State.load(args.name), args.server, command)
        elif args.command == "down":
            removed = down(args.name)
            print(f"bml-net: {args.name} down ({len(removed)} items removed)")
        elif args.command == "shape":
            state = State.load(args.name)
            shaping = Shaping(args.rate, args.delay, args.loss, args.reorder)
            reshape(state, shaping)
            print(f"bml-net: {len(state.links)} links of {state.name} re-shaped: "
                  f"{describe_shaping(shaping)}")
        elif args.command in ("fail", "restore"):
            print(inject(State.load(args.name), args))
    except (NetError, TopologyError, ValueError) as exc:
        print(f"bml-net: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
