"""The BML-INA wire protocol: the one definition used by hosts, tests and the software target.

An aggregation packet is Ethernet / IPv4 / UDP (destination port ``BML_UDP_PORT``) / ``BML``
(16 bytes) / the lanes: signed 32-bit integers in blocks of 32. How many blocks is a build
parameter of the P4 program (``Wire``): 2 (64 lanes, what a Tofino-class pipeline holds), and
wider builds for the software targets up to what a 9000-byte frame holds. A packet's ``count``
says how many blocks it carries, so a host and a switch of different widths see it at once.
``HEADER_STRUCT`` and ``pack_header`` / ``unpack_header`` are the layout for the hot paths;
``bml.layers`` describes the same packet as Scapy layers for tests and inspection (kept apart,
so that no host or switch process pays for importing Scapy).
The P4 program (``p4src/include/headers.p4`` and ``defines.p4``) must agree with every constant
here; ``tests/test_protocol.py`` checks that it does.
"""

from __future__ import annotations

import enum
import functools
import struct
from dataclasses import dataclass, field

import numpy as np

BML_UDP_PORT = 47000  # switch side: aggregation packets are addressed to this UDP port
JOB_UDP_PORT_BASE = 40000  # host side: workers of job J bind JOB_UDP_PORT_BASE + J
MAX_JOB_ID = 4095  # keeps job ports below BML_UDP_PORT
MESH_TCP_PORT_BASE = 48000  # host side: job J's workers listen for their neighbours here + J
POOL_SLOTS = 4096  # aggregation slots per switch, shared out among jobs by the control plane
ONE_NIC_WINDOW = 256  # slots (= frames in flight) of the one-NIC transport, by default
LANES_PER_BLOCK = 32
DEFAULT_LANES = 64  # int32 values per packet of the default build (a Tofino-class pipeline's)
MTU = 9000  # the emulation's links; the widest build's frame fits in it
MAX_WORKERS = 32  # width of the per-slot worker bitmap
CPU_PORT = 510  # P4Runtime PacketOut enters the pipeline on this port
CONTROLLER_MAGIC = 0xB3C0  # packet_out header value the pipeline requires on CPU_PORT frames
EXPONENT_BIAS = 127  # exponent field = e + EXPONENT_BIAS; 0 means "no exponent announced"
EXPONENT_NONE = 0
MIN_EXPONENT = 1 - EXPONENT_BIAS  # -126
MAX_EXPONENT = 255 - EXPONENT_BIAS  # 128 (every finite float32 has |x| < 2**128)
GENERATIONS = 1 << 16  # the generation field wraps here
GENERATION_HALF = 1 << 15  # up to this far ahead (mod GENERATIONS) a generation is newer
PRIMING_OFFSET = 0xFFFFFFFF  # offset field of priming and flush uses (they carry no block)
# Lanes of the one-NIC path's slot 0 priming: the length, and hashes of it (length_lanes).
_LENGTH_PRIMES = (1, 40503, 65537, 2654435761 % (1 << 20), 97, 7919, 104729, 15485863)


def newer_generation(a: int, b: int) -> bool:
    """Whether generation ``a`` is newer than ``b`` (serial-number arithmetic, as the switch
    compares them)."""
    return 0 < (a - b) % GENERATIONS < GENERATION_HALF


class PacketType(enum.IntEnum):
    DATA = 1  # a worker's contribution (also when re-sent)
    RESULT = 2  # the completed sum, sent when the last contribution arrives
    RESULT_RETX = 3  # the stored sum, sent to one worker that re-sent into a completed slot
    BROADCAST = 4  # multicast to the job's group without aggregation
    RESET = 5  # control: re-initialise one slot (both copies); accepted from CPU_PORT only
    ACK = 6  # header-only completion notice to non-owners of a reduce-scatter chunk
    GENERATION = 7  # host: which generation is the job at? switch (header only): this one
    PENDING = 8  # switch (header only): a re-sent contribution is already in its copy, which
    # still waits for others; ``count`` is the copy's contributions so far (not blocks)
    PROBE = 9  # host (header only): is my contribution to this use of the slot in? Answered
    # RESULT_RETX (the copy is complete), PENDING (in, still filling) or MISSING
    MISSING = 10  # switch (header only): the probed contribution is not in the copy


class ResultMode(enum.IntEnum):
    MULTICAST = 0  # result to every member of the job's multicast group
    TO_OWNER = 1  # result to the chunk's owner (owner_id); header-only ACK to the others


class Stat(enum.IntEnum):
    """Indices of the P4 ``stats`` counter array."""

    AGGREGATED = 0
    COMPLETED = 1
    DUPLICATE = 2
    RETX_ANSWERED = 3
    BROADCAST = 4
    RESET = 5
    FORWARDED = 6
    GENERATION = 7  # a generation query answered
    OLD_CALL = 8  # a contribution of an older call: not added, answered with the generation
    PENDING = 9  # a re-sent contribution into the filling copy it is in: answered PENDING
    MISSING = 10  # a PROBE for a contribution the copy does not hold: answered MISSING


class DropReason(enum.IntEnum):
    """Indices of the P4 ``drops`` counter array: why a packet was refused."""

    SHORT_PACKET = 0
    BAD_WIDTH = 1  # ``count`` is not the pipeline's blocks per packet: a host of another width
    UNKNOWN_JOB = 2
    FORGED_WORKER = 3
    WRONG_PORT = 4
    BAD_SLOT = 5
    BAD_TYPE = 6
    NO_OWNER = 7
    FORGED_CONTROL = 8
    NO_ROUTE = 9
    STALE = 10  # a contribution whose offset is not the one the slot copy holds
    BAD_LENGTH = 11  # IPv4, UDP or frame length is not a full aggregation packet's


STATS_SIZE = 16  # sizes of the counter arrays (>= number of enum members)
DROPS_SIZE = 16

# type, version, job_id, worker_id, owner_id, slot, exponent, count, generation, offset
HEADER_STRUCT = struct.Struct("!BBHBBHBBHI")
HEADER_BYTES = HEADER_STRUCT.size  # 16
LANE_DTYPE = np.dtype(">i4")  # the lanes as numpy reads and writes them on the wire
# Answers that end a worker's use of a slot (an ACK: the sum went to the chunk's owner).
RESULT_TYPES = frozenset((PacketType.RESULT, PacketType.RESULT_RETX, PacketType.ACK))
ETH_IP_UDP_BYTES = 14 + 20 + 8
HEADER_ONLY_FRAME_BYTES = ETH_IP_UDP_BYTES + HEADER_BYTES  # a PROBE, GENERATION, ACK...: 58


class WidthError(ValueError):
    """A lane width no build has, or that no frame holds."""


@dataclass(frozen=True)
class Wire:
    """An aggregation packet's sizes at one lane width: what the hosts, the software target,
    the cost model and the tests agree on with the P4 build they talk to."""

    lanes: int
    blocks: int = field(init=False)  # what a contribution's ``count`` says
    values_bytes: int = field(init=False)
    payload_bytes: int = field(init=False)  # UDP payload of a full aggregation packet
    frame_bytes: int = field(init=False)  # on the wire, without FCS
    zero_lanes: bytes = field(init=False, repr=False)
    values_struct: struct.Struct = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.lanes <= 0 or self.lanes % LANES_PER_BLOCK:
            raise WidthError(f"{self.lanes} lanes: a width is a positive multiple of "
                             f"{LANES_PER_BLOCK}")
        values = 4 * self.lanes
        if 20 + 8 + HEADER_BYTES + values > MTU:
            raise WidthError(f"{self.lanes} lanes do not fit a {MTU}-byte MTU (at most "
                             f"{WIDEST_LANES})")
        for name, value in (("blocks", self.lanes // LANES_PER_BLOCK),
                            ("values_bytes", values),
                            ("payload_bytes", HEADER_BYTES + values),
                            ("frame_bytes", ETH_IP_UDP_BYTES + HEADER_BYTES + values),
                            ("zero_lanes", bytes(values)),
                            ("values_struct", struct.Struct(f"!{self.lanes}i"))):
            object.__setattr__(self, name, value)

    def chunks(self, elements: int) -> int:
        """Packets (at least one) that carry ``elements`` values."""
        return max(1, -(-elements // self.lanes))


# The widest packet a 9000-byte IPv4 MTU holds, in whole blocks: 69 blocks, 2,208 lanes.
WIDEST_LANES = (MTU - 20 - 8 - HEADER_BYTES) // (4 * LANES_PER_BLOCK) * LANES_PER_BLOCK
BUILT_LANES = (DEFAULT_LANES, 256, WIDEST_LANES)  # the widths p4src/build/ holds


@functools.cache
def wire(lanes: int = DEFAULT_LANES) -> Wire:
    """The sizes at ``lanes`` (one shared object per width)."""
    return Wire(lanes)


DEFAULT_WIRE = wire(DEFAULT_LANES)


def pack_header(
    ptype: int,
    job_id: int,
    worker_id: int,
    slot: int,
    version: int = 0,
    owner_id: int = 0,
    exponent: int = EXPONENT_NONE,
    count: int = DEFAULT_WIRE.blocks,
    offset: int = 0,
    generation: int = 0,
) -> bytes:
    return HEADER_STRUCT.pack(
        ptype, version, job_id, worker_id, owner_id, slot, exponent, count, generation, offset
    )


def unpack_header(payload: bytes | memoryview) -> tuple[int, ...]:
    """(type, version, job_id, worker_id, owner_id, slot, exponent, count, generation,
    offset)."""
    return HEADER_STRUCT.unpack_from(payload, 0)


def probe_of(frame: bytes) -> bytes:
    """The header-only PROBE for a DATA frame: it asks whether that contribution is in its
    slot copy, for a fifth of the frame's bytes."""
    return bytes((PacketType.PROBE,)) + frame[1:HEADER_BYTES]


def generation_question(job: int, worker: int, wire: Wire) -> bytes:
    """A GENERATION question of ``worker`` (the header alone): its ``count`` is the blocks the
    worker sends, and the answer's the switch's, so a mismatch is seen on the first answer."""
    return pack_header(PacketType.GENERATION, job, worker, 0, count=wire.blocks)


def width_mismatch(switch_blocks: int, wire: Wire, switch: str) -> str | None:
    """The error for a GENERATION answer from a switch of another width, or None."""
    if switch_blocks == wire.blocks:
        return None
    return (f"switch {switch} aggregates {switch_blocks * LANES_PER_BLOCK} lanes per packet "
            f"and this worker sends {wire.lanes}: the job was set up for another P4 build "
            f"(set it up again: bml-ctl job-add)")


def length_lanes(length: int) -> list[int]:
    """Lane 0: the length; lanes 1-7: hashes of it, each < 2**20 so N of them sum safely.

    If the sums over the N workers equal N times a worker's own lanes, that worker's length
    is almost surely everyone's (one exact check, seven pseudo-random ones)."""
    return [length] + [(length * p) % (1 << 20) for p in _LENGTH_PRIMES[1:]]


def job_udp_port(job_id: int) -> int:
    """The UDP port every worker of a job binds, so multicast results reach all of them."""
    return JOB_UDP_PORT_BASE + job_id


def mesh_tcp_port(job_id: int) -> int:
    """The TCP port a job's workers listen on for their BCube neighbours (host-to-host)."""
    return MESH_TCP_PORT_BASE + job_id
