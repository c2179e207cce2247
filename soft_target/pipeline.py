"""The BML-INA pipeline in Python: the software target's twin of ``p4src/bml.p4``.

Each method mirrors one P4 control block and keeps its order of checks, so that the packet
tests that run against simple_switch_grpc hold this implementation to the same bytes. Where
the two could differ, the P4 program is the reference. Table contents are plain dicts that the
P4Runtime server (``soft_target.p4runtime_server``) replaces whole on every write, so the
packet loop never sees a half-written table.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from bml.protocol import (
    BML_UDP_PORT,
    CONTROLLER_MAGIC,
    CPU_PORT,
    DROPS_SIZE,
    HEADER_BYTES,
    HEADER_STRUCT,
    POOL_SLOTS,
    STATS_SIZE,
    VALUES_PER_PACKET,
    DropReason,
    PacketType,
    ResultMode,
    Stat,
    newer_generation,
)

POOL_COPIES = 2 * POOL_SLOTS
ETH, IP, UDP = 14, 20, 8
BML_OFF = ETH + IP + UDP  # 42
VALUES_OFF = BML_OFF + HEADER_BYTES  # 58
FULL_END = VALUES_OFF + 4 * VALUES_PER_PACKET  # 314
LO_END = VALUES_OFF + 2 * VALUES_PER_PACKET  # 186
IPV4_LEN_FULL, UDP_LEN_FULL = 300, 280
IPV4_LEN_HEADER_ONLY, UDP_LEN_HEADER_ONLY = 44, 24
_ACCEPTED_TYPES = (PacketType.DATA, PacketType.BROADCAST, PacketType.RESET,
                   PacketType.GENERATION)
JOB_IDS = 4096  # one generation register per job id
_BE_VALUES = np.dtype(">i4")
_IPV4_WORDS = struct.Struct("!10H")
_UDP_HALF = struct.Struct("!HH")  # two words of the UDP header: ports, or length and checksum
_IPV4_HEAD = struct.Struct("!BBH2s2sBBH")  # up to the checksum; the addresses follow
_BML_PORT_BYTES = BML_UDP_PORT.to_bytes(2, "big")
_IPV4_LEN_FULL = IPV4_LEN_FULL.to_bytes(2, "big")
_UDP_LEN_FULL = UDP_LEN_FULL.to_bytes(2, "big")


@dataclass(frozen=True)
class JobConfig:
    """Parameters of ``Admission.set_job``."""

    pool_base: int
    pool_size: int
    num_workers: int
    result_mode: int
    mcast_grp: int


@dataclass(frozen=True)
class HostAddress:
    """Parameters of ``EgressRewrite.set_host_address``, with what every copy to that port
    shares precomputed once per table write (the packet loop only adds the per-packet part)."""

    host_mac: bytes
    host_ip: bytes
    switch_mac: bytes
    switch_ip: bytes
    ethernet: bytes = field(init=False, repr=False, compare=False)  # dst, src, IPv4 type
    addresses: bytes = field(init=False, repr=False, compare=False)  # IPv4 src, dst
    address_sum: int = field(init=False, repr=False, compare=False)  # their checksum words

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "ethernet", self.host_mac + self.switch_mac + b"\x08\x00")
        set_field(self, "addresses", self.switch_ip + self.host_ip)
        set_field(self, "address_sum", sum(struct.unpack("!4H", self.addresses)))


@dataclass
class Tables:
    """Everything the control plane installs; each attribute is replaced, never mutated."""

    l2_forward: dict[bytes, int] = field(default_factory=dict)
    job_config: dict[int, JobConfig] = field(default_factory=dict)
    worker_admission: dict[tuple[int, int], int] = field(default_factory=dict)
    owner_route: dict[tuple[int, int], int] = field(default_factory=dict)
    host_address: dict[int, HostAddress] = field(default_factory=dict)
    mcast_groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    l2_default: int | None = None  # l2_forward's default: forward_to(port), or no_route


def ipv4_checksum(header: bytes | bytearray) -> int:
    """RFC 791 checksum of a 20-byte header whose checksum field is zero."""
    total = sum(_IPV4_WORDS.unpack_from(header))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


class Pipeline:
    """Registers, counters and tables of one switch, and the per-packet logic."""

    def __init__(self) -> None:
        self.tables = Tables()
        self.stats = [0] * STATS_SIZE
        self.drops = [0] * DROPS_SIZE
        self.unaddressed = [0]
        self.reset_registers()

    def reset_registers(self) -> None:
        """Power-on state: what a freshly started switch holds."""
        self.worker_bitmap = [0] * POOL_COPIES
        self.contributions = [0] * POOL_COPIES
        self.max_exponent = [0] * POOL_COPIES
        self.chunk_offset = [0] * POOL_COPIES
        self.copy_generation = [0] * POOL_COPIES
        self.job_generation = [0] * JOB_IDS
        self.sums = np.zeros((POOL_COPIES, VALUES_PER_PACKET), dtype=np.int32)

    # ------------------------------------------------------------------ ingress
    def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """One packet in, the copies it leaves as (egress port, frame)."""
        if port == CPU_PORT:
            if len(frame) >= 2 and int.from_bytes(frame[:2], "big") != CONTROLLER_MAGIC:
                return self._drop(DropReason.FORGED_CONTROL)
            from_controller = len(frame) >= 2
            frame = frame[2:]
        else:
            from_controller = False
        n = len(frame)
        # BmlParser: untagged IPv4, version 4, IHL 5, not a fragment (MF clear, offset 0), UDP
        # to BML_UDP_PORT; anything else (802.1Q tags included) is ordinary traffic.
        is_bml = (
            n >= BML_OFF
            and frame[12:14] == b"\x08\x00"
            and frame[14] == 0x45
            and (frame[20] & 0x3F) == 0 == frame[21]
            and frame[23] == 17
            and frame[36:38] == _BML_PORT_BYTES
        )
        if not is_bml:
            return self._forward(frame)
        if n < FULL_END:
            return self._drop(DropReason.SHORT_PACKET)
        if n != FULL_END or frame[16:18] != _IPV4_LEN_FULL or frame[38:40] != _UDP_LEN_FULL:
            return self._drop(DropReason.BAD_LENGTH)
        (ptype, version, job_id, worker_id, _owner, slot, exponent, count, generation,
         offset) = HEADER_STRUCT.unpack_from(frame, BML_OFF)
        # Admission
        if count > VALUES_PER_PACKET:
            return self._drop(DropReason.BAD_COUNT)
        if version > 1 or ptype not in _ACCEPTED_TYPES:
            return self._drop(DropReason.BAD_TYPE)
        tables = self.tables
        job = tables.job_config.get(job_id)
        if job is None:
            return self._drop(DropReason.UNKNOWN_JOB)
        if slot >= job.pool_size:
            return self._drop(DropReason.BAD_SLOT)
        if ptype == PacketType.RESET:
            if port != CPU_PORT or not from_controller:
                return self._drop(DropReason.FORGED_CONTROL)
        else:
            worker_port = tables.worker_admission.get((job_id, worker_id))
            if worker_port is None:
                return self._drop(DropReason.FORGED_WORKER)
            if worker_port != port:
                return self._drop(DropReason.WRONG_PORT)
        if ptype == PacketType.BROADCAST:
            self.stats[Stat.BROADCAST] += 1
            values = frame[VALUES_OFF:FULL_END]
            return self._route(frame, port, job, ptype, exponent, values, tables)
        return self._aggregate(frame, port, job, job_id, ptype, version, worker_id, slot,
                               exponent, generation, offset, tables)

    def _aggregate(self, frame: bytes, port: int, job: JobConfig, job_id: int, ptype: int,
                   version: int, worker_id: int, slot: int, exponent: int, generation: int,
                   offset: int, tables: Tables) -> list[tuple[int, bytes]]:
        copy0 = ((job.pool_base + slot) << 1) & 0xFFFFFFFF  # bit<32> arithmetic
        past = copy0 >= POOL_COPIES
        bitmaps = self.worker_bitmap
        if ptype == PacketType.RESET:
            if not past:
                bitmaps[copy0] = bitmaps[copy0 | 1] = 0
                self.contributions[copy0] = self.contributions[copy0 | 1] = 0
            if job_id < JOB_IDS:
                self.job_generation[job_id] = 0  # a job set up afresh
            self.stats[Stat.RESET] += 1
            return []
        current = self.job_generation[job_id] if job_id < JOB_IDS else 0
        if ptype == PacketType.DATA and newer_generation(generation, current):
            current = generation  # a newer call: from now on the job's
            if job_id < JOB_IDS:
                self.job_generation[job_id] = current
        if ptype == PacketType.GENERATION or generation != current:
            # A query, or a contribution of an older call: answered with the job's generation.
            self.stats[Stat.GENERATION if ptype == PacketType.GENERATION else Stat.OLD_CALL] += 1
            return self._route(frame, port, job, PacketType.GENERATION, exponent, b"", tables,
                               generation=current)
        if past:
            return self._past_registers(frame, port, job, exponent, tables)
        idx = copy0 | version
        other = copy0 | (1 - version)
        me = (1 << worker_id) & 0xFFFFFFFF
        bitmap = bitmaps[idx]
        count = self.contributions[idx]
        stored_offset = self.chunk_offset[idx]
        if self.copy_generation[idx] != generation:
            bitmap = count = 0  # left by an older call: abandoned
        if bitmap & me:
            if count == job.num_workers and stored_offset == offset:
                self.stats[Stat.RETX_ANSWERED] += 1
                values = self.sums[idx].astype(_BE_VALUES).tobytes()
                return self._route(frame, port, job, PacketType.RESULT_RETX,
                                   self.max_exponent[idx], values, tables)
            if stored_offset == offset:
                # Still filling: the sender learns that its contribution is in (header only,
                # with the count so far).
                self.stats[Stat.PENDING] += 1
                return self._route(frame, port, job, PacketType.PENDING, exponent, b"", tables,
                                   count=count)
            self.stats[Stat.DUPLICATE] += 1
            return []
        if bitmap and stored_offset != offset:
            return self._drop(DropReason.STALE)
        if count == job.num_workers and stored_offset == offset:
            # A late copy from a worker that moved on, even after every worker moved on.
            self.stats[Stat.DUPLICATE] += 1
            return []
        row = self.sums[idx]
        incoming = np.frombuffer(frame, dtype=_BE_VALUES, count=VALUES_PER_PACKET,
                                 offset=VALUES_OFF)
        if bitmap == 0:
            count = 0
            best = 0
            self.chunk_offset[idx] = offset
            self.copy_generation[idx] = generation
            row[:] = incoming
        else:
            best = self.max_exponent[idx]
            np.add(row, incoming, out=row, casting="unsafe")
        bitmaps[idx] = bitmap | me
        bitmaps[other] &= ~me & 0xFFFFFFFF
        count = (count + 1) & 0xFF
        self.contributions[idx] = count
        if exponent > best:
            best = exponent
        self.max_exponent[idx] = best
        self.stats[Stat.AGGREGATED] += 1
        if count != job.num_workers:
            return []
        self.stats[Stat.COMPLETED] += 1
        return self._route(frame, port, job, PacketType.RESULT, best,
                           row.astype(_BE_VALUES).tobytes(), tables)

    def _past_registers(self, frame: bytes, port: int, job: JobConfig, exponent: int,
                        tables: Tables) -> list[tuple[int, bytes]]:
        """A pool that lies past the register arrays (only a control plane that does not check
        installs one; ours keeps pools inside POOL_SLOTS). BMv2 reads 0 there and ignores the
        writes, so every contribution is the first of an empty copy and nothing is kept: a
        RESET is counted (above), a contribution is aggregated alone and completes only a
        one-worker job, with its own values."""
        self.stats[Stat.AGGREGATED] += 1
        if job.num_workers != 1:
            return []
        self.stats[Stat.COMPLETED] += 1
        return self._route(frame, port, job, PacketType.RESULT, exponent,
                           frame[VALUES_OFF:FULL_END], tables)

    def _route(self, frame: bytes, port: int, job: JobConfig, ptype: int, exponent: int,
               values: bytes, tables: Tables, generation: int | None = None,
               count: int | None = None) -> list[tuple[int, bytes]]:
        """ResultRouting, then EgressRewrite for every copy. A GENERATION answer (header only,
        ``generation`` in it) and a PENDING answer (header only, the copy's ``count`` in it) go
        back to the sender."""
        owner_port = None
        if ptype in (PacketType.RESULT, PacketType.RESULT_RETX) and \
                job.result_mode == ResultMode.TO_OWNER:
            owner_id = frame[BML_OFF + 5]
            owner_port = tables.owner_route.get((frame[BML_OFF + 2] << 8 | frame[BML_OFF + 3],
                                                 owner_id))
            if owner_port is None:
                return self._drop(DropReason.NO_OWNER)
        if ptype in (PacketType.RESULT_RETX, PacketType.GENERATION, PacketType.PENDING):
            egress_ports: tuple[int, ...] = (port,)
        else:
            egress_ports = tables.mcast_groups.get(job.mcast_grp, ())
        # IPv4: what the trigger gives (TOS, id, flags) and what the switch writes (TTL 64,
        # UDP, fixed lengths); per copy only the length and the addresses change the checksum.
        tos, ident, flags = frame[ETH + 1], frame[ETH + 4:ETH + 6], frame[ETH + 6:ETH + 8]
        trigger_sum = (0x4500 | tos) + (ident[0] << 8 | ident[1]) + (flags[0] << 8 | flags[1]) \
            + 0x4011
        udp_ports = _UDP_HALF.pack(BML_UDP_PORT, frame[34] << 8 | frame[35])
        bml = bytearray(frame[BML_OFF:VALUES_OFF])
        bml[0] = ptype
        bml[8] = exponent
        if generation is not None:
            bml[10:12] = generation.to_bytes(2, "big")
        if count is not None:
            bml[9] = count
        full_body = bytes(bml) + values
        out = []
        for egress_port in egress_ports:
            if ptype == PacketType.BROADCAST and egress_port == port:
                continue
            address = tables.host_address.get(egress_port)
            if address is None:
                self.unaddressed[0] += 1
                continue
            if owner_port is not None and egress_port != owner_port:
                bml[0] = PacketType.ACK
                body = bytes(bml)
                ip_len, udp_len = IPV4_LEN_HEADER_ONLY, UDP_LEN_HEADER_ONLY
            elif not values:
                body = full_body
                ip_len, udp_len = IPV4_LEN_HEADER_ONLY, UDP_LEN_HEADER_ONLY
            else:
                body = full_body
                ip_len, udp_len = IPV4_LEN_FULL, UDP_LEN_FULL
            total = trigger_sum + ip_len + address.address_sum
            total = (total & 0xFFFF) + (total >> 16)
            total = (total & 0xFFFF) + (total >> 16)
            out.append((egress_port, b"".join((
                address.ethernet,
                _IPV4_HEAD.pack(0x45, tos, ip_len, ident, flags, 64, 17, ~total & 0xFFFF),
                address.addresses, udp_ports, _UDP_HALF.pack(udp_len, 0), body))))
        return out

    def _forward(self, frame: bytes) -> list[tuple[int, bytes]]:
        """Forwarding.l2_forward: the frame leaves byte for byte as it came (the checksum
        unit rewrites only the packets the switch makes)."""
        if len(frame) < ETH:
            return self._drop(DropReason.NO_ROUTE)
        tables = self.tables
        egress = tables.l2_forward.get(frame[0:6], tables.l2_default)
        if egress is None:
            return self._drop(DropReason.NO_ROUTE)
        self.stats[Stat.FORWARDED] += 1
        return [(egress, frame)]

    def _drop(self, reason: DropReason) -> list[tuple[int, bytes]]:
        self.drops[reason] += 1
        return []
