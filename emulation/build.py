"""Building an emulation's network: namespaces, links, static neighbours, detour routes,
shaping, and a switch process on each switch's links.

Each thing made is recorded in the state before the next is made, so that ``down`` finds it
however far the build got.
"""

from __future__ import annotations

from bml.topology import Switch, Topology
from emulation import netns
from emulation.netns import Shaping
from emulation.processes import free_tcp_port, start_switch_process, wait_for_port
from emulation.state import State, SwitchProcess


def build(state: State, topology: Topology, shaping: Shaping, target: str,
          bmv2: str | None) -> None:
    """Make every namespace, link and switch process of ``topology``; returns once every
    switch serves P4Runtime (nothing is provisioned yet)."""
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
