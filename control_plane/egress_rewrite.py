"""Programs ``p4src/egress_rewrite.p4``: the address of the host behind every port."""

from __future__ import annotations

from bml.frames import ip_bytes, mac_bytes
from bml.topology import Switch, Topology
from control_plane.p4info import Names
from control_plane.session import Entry, entry


def host_address_entry(port: int, host_mac: bytes, host_ip: bytes, switch_mac: bytes,
                       switch_ip: bytes) -> Entry:
    """One port's entry: the addresses egress writes into every frame the switch sends a host
    there (the host's as destination, the switch's as source)."""
    return entry(Names.HOST_ADDRESS, {"standard_metadata.egress_port": port},
                 Names.SET_HOST_ADDRESS,
                 host_mac=int.from_bytes(host_mac, "big"), host_ip=int.from_bytes(host_ip, "big"),
                 switch_mac=int.from_bytes(switch_mac, "big"),
                 switch_ip=int.from_bytes(switch_ip, "big"))


def host_address_entries(topology: Topology, switch: Switch) -> list[Entry]:
    result = []
    for server in switch.servers:
        nic = topology.nics(server)[switch.level]
        result.append(host_address_entry(nic.port, mac_bytes(nic.mac), ip_bytes(nic.ip),
                                         mac_bytes(switch.mac), ip_bytes(switch.ip)))
    return result
