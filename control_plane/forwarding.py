"""Programs ``p4src/forwarding.p4``: ordinary traffic by destination MAC."""

from __future__ import annotations

from bml.topology import Switch, Topology, mac_to_int
from control_plane.p4info import Names
from control_plane.session import Entry, entry


def forwarding_entries(topology: Topology, switch: Switch) -> list[Entry]:
    """One entry per attached NIC, so servers on the same switch reach each other."""
    return [
        entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": mac_to_int(nic.mac)},
              Names.FORWARD_TO, port=nic.port)
        for server in switch.servers
        for nic in topology.nics(server)
        if nic.switch == switch.name
    ]
