"""Programs ``p4src/aggregation.p4``, whose registers P4Runtime cannot write on BMv2.

Slots are re-initialised through the data plane instead: one RESET frame per slot, sent as a
P4Runtime PacketOut so that it enters on the CPU port, the only port RESET is accepted from.
"""

from __future__ import annotations

from bml.protocol import (
    BML_UDP_PORT,
    HEADER_BYTES,
    VALUES_BYTES,
    PacketType,
    pack_header,
)
from bml.topology import Switch, ip_to_int, mac_to_int
from control_plane.jobs import AggregationGroup


def reset_frames(switch: Switch, group: AggregationGroup) -> list[bytes]:
    """RESET frames for every slot of the group's pool (both copies of each)."""
    mac = mac_to_int(switch.mac).to_bytes(6, "big")
    ip = ip_to_int(switch.ip).to_bytes(4, "big")
    udp_length = 8 + HEADER_BYTES + VALUES_BYTES
    ip_header = (b"\x45\x00" + (20 + udp_length).to_bytes(2, "big") + b"\x00\x00\x00\x00"
                 b"\x40\x11\x00\x00" + ip + ip)
    udp = BML_UDP_PORT.to_bytes(2, "big") * 2 + udp_length.to_bytes(2, "big") + b"\x00\x00"
    prefix = mac + mac + b"\x08\x00" + ip_header + udp
    zeros = bytes(VALUES_BYTES)
    return [prefix + pack_header(PacketType.RESET, group.job_id, 0, slot) + zeros
            for slot in range(group.pool_size)]
