"""The P4 program's defines (``p4src/include/defines.p4``) that the controls test per packet.

Taken from ``bml.protocol``'s enums (which tests/test_protocol.py holds to defines.p4) and kept
as plain ints under the P4 names: reading an enum member (``PacketType.DATA``) is an attribute
look-up on the enum class that costs more than a function call in CPython, and the packet
loop does a dozen per packet.
"""

from __future__ import annotations

from bml.protocol import DropReason, PacketType, ResultMode, Stat, Wire

TYPE_DATA = int(PacketType.DATA)
TYPE_RESULT = int(PacketType.RESULT)
TYPE_RESULT_RETX = int(PacketType.RESULT_RETX)
TYPE_BROADCAST = int(PacketType.BROADCAST)
TYPE_RESET = int(PacketType.RESET)
TYPE_ACK = int(PacketType.ACK)
TYPE_GENERATION = int(PacketType.GENERATION)
TYPE_PENDING = int(PacketType.PENDING)
TYPE_PROBE = int(PacketType.PROBE)
TYPE_MISSING = int(PacketType.MISSING)

MODE_TO_OWNER = int(ResultMode.TO_OWNER)

STAT_AGGREGATED = int(Stat.AGGREGATED)
STAT_COMPLETED = int(Stat.COMPLETED)
STAT_DUPLICATE = int(Stat.DUPLICATE)
STAT_RETX_ANSWERED = int(Stat.RETX_ANSWERED)
STAT_BROADCAST = int(Stat.BROADCAST)
STAT_RESET = int(Stat.RESET)
STAT_FORWARDED = int(Stat.FORWARDED)
STAT_GENERATION = int(Stat.GENERATION)
STAT_OLD_CALL = int(Stat.OLD_CALL)
STAT_PENDING = int(Stat.PENDING)
STAT_MISSING = int(Stat.MISSING)

# No answer is larger than its question by more than this (BMv2's simple_switch gives a packet
# that much room to grow): a PROBE (header only) is answered with the stored sum only where the
# lanes fit in it, at most 4 blocks; in wider builds MISSING instead (defines.p4's
# PROBE_ANSWERS_SUM).
ANSWER_GROWTH_BYTES = 512


def probe_answers_sum(wire: Wire) -> bool:
    """PROBE_ANSWERS_SUM at ``wire``'s width: does a PROBE into its completed copy get the sum?"""
    return wire.values_bytes <= ANSWER_GROWTH_BYTES


DROP_SHORT_PACKET = int(DropReason.SHORT_PACKET)
DROP_BAD_WIDTH = int(DropReason.BAD_WIDTH)
DROP_UNKNOWN_JOB = int(DropReason.UNKNOWN_JOB)
DROP_FORGED_WORKER = int(DropReason.FORGED_WORKER)
DROP_WRONG_PORT = int(DropReason.WRONG_PORT)
DROP_BAD_SLOT = int(DropReason.BAD_SLOT)
DROP_BAD_TYPE = int(DropReason.BAD_TYPE)
DROP_NO_OWNER = int(DropReason.NO_OWNER)
DROP_FORGED_CONTROL = int(DropReason.FORGED_CONTROL)
DROP_NO_ROUTE = int(DropReason.NO_ROUTE)
DROP_STALE = int(DropReason.STALE)
DROP_BAD_LENGTH = int(DropReason.BAD_LENGTH)
