"""Programs ``p4src/egress_rewrite.p4``: the address of the host behind every port."""

from __future__ import annotations

from bml.topology import Switch, Topology, ip_to_int, mac_to_int
from control_plane.p4info import Names
from control_plane.session import Entry, entry


def host_address_entries(topology: Topology, switch: Switch) -> list[Entry]:
    result = []
    for server in switch.servers:
        nic = topology.nics(server)[switch.level]
        result.append(entry(
            Names.HOST_ADDRESS, {"standard_metadata.egress_port": nic.port},
            Names.SET_HOST_ADDRESS,
            host_mac=mac_to_int(nic.mac), host_ip=ip_to_int(nic.ip),
            switch_mac=mac_to_int(switch.mac), switch_ip=ip_to_int(switch.ip)))
    return result
