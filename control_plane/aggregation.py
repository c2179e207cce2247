"""Programs ``p4src/aggregation.p4``, whose registers P4Runtime cannot write on BMv2.

Slots are re-initialised through the data plane instead: one RESET frame per slot, sent as a
P4Runtime PacketOut so that it enters on the CPU port, the only port RESET is accepted from.
"""

from __future__ import annotations

from bml.frames import ip_bytes, mac_bytes, reset_frame
from bml.protocol import DEFAULT_WIRE, Wire
from bml.topology import Switch
from control_plane.jobs import AggregationGroup


def reset_frames(switch: Switch, group: AggregationGroup,
                 wire: Wire = DEFAULT_WIRE) -> list[bytes]:
    """RESET frames for every slot of the group's pool (both copies of each), full frames of
    the switch's lane width (a frame of another width is dropped as BAD_WIDTH)."""
    mac, ip = mac_bytes(switch.mac), ip_bytes(switch.ip)
    return [reset_frame(mac, ip, group.job_id, slot, wire) for slot in range(group.pool_size)]
