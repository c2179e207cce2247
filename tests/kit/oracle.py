"""The reference model the differential test holds every target to: for each packet, the
counters it must move and the exact frames that must leave (docs/PROTOCOL.md).

``Event`` is one packet of a sequence with its ``Expect``; ``SwitchModel`` is what a switch
holds that decides a packet's fate beyond its tables (each job's generation, l2_forward's
default entry) and builds the expectations; ``switch_frame`` is every frame the switch sends
a host, byte for byte; ``Observation`` is what a target did, to compare with the expectation
and between targets.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from bml.frames import SWITCH_IP, SWITCH_MAC, host_ip, host_mac, udp_frame
from bml.protocol import (
    BML_UDP_PORT,
    CONTROLLER_MAGIC,
    CPU_PORT,
    DEFAULT_WIRE,
    HEADER_BYTES,
    DropReason,
    PacketType,
    Stat,
    newer_generation,
)
from tests.kit.counters import Counters, moved, named


def switch_frame(trigger: bytes, port: int, ptype: int, exponent: int,
                 values: bytes | None, generation: int | None = None,
                 count: int | None = None) -> bytes:
    """What the switch sends to the host on ``port`` in answer to ``trigger`` (docs/PROTOCOL.md
    "Framing"): its addresses, the trigger's TOS, identification, flags and BML fields, TTL 64,
    fixed lengths, UDP checksum 0; ``values`` (all the lanes of the switch's width) None for
    a header-only ACK, GENERATION answer (which carries the job's ``generation`` and the
    switch's blocks in ``count``) or PENDING answer (the copy's ``count``)."""
    udp_len = 8 + HEADER_BYTES + len(values or b"")
    ip_len = 20 + udp_len
    header = bytearray(trigger[42:58])
    header[0] = ptype
    header[8] = exponent
    if generation is not None:
        header[10:12] = generation.to_bytes(2, "big")
    if count is not None:
        header[9] = count
    return udp_frame(host_mac(port), SWITCH_MAC, SWITCH_IP, host_ip(port), BML_UDP_PORT,
                     int.from_bytes(trigger[34:36], "big"), bytes(header) + (values or b""),
                     tos=trigger[15], ident=int.from_bytes(trigger[18:20], "big"),
                     flags=int.from_bytes(trigger[20:22], "big"), ttl=64, ip_length=ip_len,
                     udp_length=udp_len)


def wrapping_sum(vectors: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Lane sums as the switch's 32-bit adders make them (two's complement, wrapping)."""
    sums = []
    for column in zip(*vectors, strict=True):
        sums.append((sum(column) + (1 << 31)) % (1 << 32) - (1 << 31))
    return tuple(sums)


@dataclass
class Expect:
    """What one packet must do: counter increments and the frames that leave."""

    stats: Counter = field(default_factory=Counter)
    drops: Counter = field(default_factory=Counter)
    unaddressed: int = 0
    outputs: list[tuple[int, bytes]] = field(default_factory=list)


@dataclass
class Event:
    """One packet: into ``port`` (CPU_PORT: a PacketOut with ``magic``); or, with
    ``control``, no packet but the controller setting l2_forward's default entry to
    forward_to(``l2_default``) (None: back to the program's no_route)."""

    index: int
    what: str
    port: int
    frame: bytes
    expect: Expect
    magic: int = CONTROLLER_MAGIC
    control: bool = False
    l2_default: int | None = None

    @property
    def kind(self) -> str:
        """``what`` without its numbers (job, slot, use, worker): what the report tallies."""
        return " ".join(w for w in self.what.split()
                        if not re.fullmatch(r"[jsuw]?\d+", w)).rstrip(",")

    def magic_bytes(self) -> bytes:
        """A PacketOut's magic metadata as sent: 2 bytes, or more for a value too wide."""
        return self.magic.to_bytes(max(2, (self.magic.bit_length() + 7) // 8), "big")

    def wire(self) -> bytes:
        """The frame as the pipeline sees it (a PacketOut's packet_out header in front)."""
        if self.port == CPU_PORT:
            return self.magic_bytes() + self.frame
        return self.frame


class SwitchModel:
    """The switch's state that decides a packet's fate beyond its tables: each job's
    generation register and l2_forward's default entry (``l2_default``: forward_to that
    port; None: no_route). Copies to a port outside ``addressed_ports`` (no host_address
    entry) are counted unaddressed instead of sent."""

    def __init__(self, job_ids: Iterable[int], addressed_ports: Iterable[int],
                 blocks: int = DEFAULT_WIRE.blocks) -> None:
        self.blocks = blocks  # the switch's width, in blocks: what its GENERATION answers say
        self.generation = {job_id: 0 for job_id in job_ids}
        self.l2_default: int | None = None
        self.addressed_ports = tuple(addressed_ports)

    @staticmethod
    def drop(reason: DropReason) -> Expect:
        return Expect(drops=Counter({reason: 1}))

    def deliver(self, expect: Expect, port: int, frame: bytes) -> None:
        """``frame`` leaves on ``port``, or is counted unaddressed there."""
        if port in self.addressed_ports:
            expect.outputs.append((port, frame))
        else:
            expect.unaddressed += 1

    def admitted(self, job_id: int, generation: int, trigger: bytes,
                 port: int) -> Expect | None:
        """A DATA past admission meets the job's generation: a newer one becomes the job's;
        an older one is answered with it (the Expect returned), never added."""
        current = self.generation[job_id]
        if newer_generation(generation, current):
            self.generation[job_id] = generation
            return None
        if generation == current:
            return None
        return self.generation_answer(job_id, trigger, port, Stat.OLD_CALL)

    def generation_answer(self, job_id: int, trigger: bytes, port: int, stat: Stat) -> Expect:
        """The job's generation, header only, back to the asking port, with the switch's
        blocks."""
        expect = Expect(stats=Counter({stat: 1}))
        self.deliver(expect, port, switch_frame(trigger, port, PacketType.GENERATION,
                                                trigger[50], None, self.generation[job_id],
                                                count=self.blocks))
        return expect

    def no_entry(self, frame: bytes) -> Expect:
        """Ordinary traffic l2_forward has no entry for: its default entry decides."""
        if self.l2_default is None:
            return self.drop(DropReason.NO_ROUTE)
        return Expect(stats=Counter({Stat.FORWARDED: 1}), outputs=[(self.l2_default, frame)])

    def copies(self, trigger: bytes, ptype: int, exponent: int, values: bytes | None,
               expect: Expect, ports: list[int], owner_port: int | None) -> None:
        """Egress: every copy addressed, or counted unaddressed; ACKs to non-owners."""
        for port in ports:
            if owner_port is not None and port != owner_port:
                frame = switch_frame(trigger, port, PacketType.ACK, exponent, None)
            else:
                frame = switch_frame(trigger, port, ptype, exponent, values)
            self.deliver(expect, port, frame)

    def answer(self, members: dict[int, int], to_owner: bool,
               contributions: list[tuple[tuple[int, ...], int]], trigger: bytes, ptype: int,
               expect: Expect, ports: list[int]) -> None:
        """A completed round's sum leaves (RESULT or RESULT_RETX), or NO_OWNER drops it.
        ``members``: worker -> port; ``contributions``: (values, exponent) of each."""
        owner_port = None
        if to_owner:  # ResultRouting looks up the owner the trigger names
            owner_port = members.get(trigger[47])
            if owner_port is None:
                expect.drops[DropReason.NO_OWNER] += 1
                return
        total = wrapping_sum([values for values, _ in contributions])
        exponent = max(exponent for _, exponent in contributions)
        self.copies(trigger, ptype, exponent, struct.pack(f"!{len(total)}i", *total), expect,
                    ports, owner_port)


@dataclass
class Observation:
    """What one packet did on one target: counter increments and the frames that left."""

    stats: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    unaddressed: int = 0
    outputs: list[tuple[int, str]] = field(default_factory=list)  # (port, hex), sorted

    @classmethod
    def expected(cls, expect: Expect) -> Observation:
        return cls(named(expect.stats, Stat), named(expect.drops, DropReason),
                   expect.unaddressed, sorted((p, f.hex()) for p, f in expect.outputs))

    @classmethod
    def of(cls, before: Counters, after: Counters,
           outputs: list[tuple[int, bytes]]) -> Observation:
        return cls(moved(before.stats, after.stats, Stat),
                   moved(before.drops, after.drops, DropReason),
                   after.unaddressed - before.unaddressed,
                   sorted((p, f.hex()) for p, f in outputs))

    def differences(self, other: Observation) -> list[str]:
        """What differs, in words (``self`` is the reference)."""
        found = []
        for name in ("stats", "drops", "unaddressed"):
            if getattr(self, name) != getattr(other, name):
                found.append(f"{name}: {getattr(self, name)} vs {getattr(other, name)}")
        if self.outputs != other.outputs:
            mine, theirs = Counter(self.outputs), Counter(other.outputs)
            found += [f"missing on port {p}: {f}" for p, f in (mine - theirs).elements()]
            found += [f"extra on port {p}: {f}" for p, f in (theirs - mine).elements()]
        return found
