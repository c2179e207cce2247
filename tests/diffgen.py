"""Seeded random packet sequences for the differential test, each packet with what any target
must do with it.

The generator plays the hosts and the controller of three jobs on one switch: rounds of
contributions (in the order hosts may send them: a slot's next use only after its previous one
completed), new calls (a newer generation abandons what the last one left), generation
questions and contributions of older calls, re-sends into filling copies (PENDING),
retransmissions, probes (PENDING, MISSING, the stored sum), late copies, stale and forged
contributions, malformed frames, ordinary traffic, broadcasts, controller PacketOuts (RESETs,
forged ones) and changes of l2_forward's default entry. It knows by construction what each
packet must do (docs/PROTOCOL.md): the counters it moves and the exact frames that leave. So
the same sequence checks the software target alone against the invariants (a round's result is
the wrapping int32 sum of its contributions; a packet that is not admitted changes no later
result, because every later frame is predicted without it; every packet is counted, drops by
reason), and checks BMv2 and the software target against each other byte for byte
(tests/diffrun.py). This module is the scenario (jobs, tables) and the sequence; the model
that predicts each packet's fate is ``tests.kit.oracle``, the frames ``bml.frames`` and
``tests.kit.frames``."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from bml.frames import (
    SWITCH_IP,
    SWITCH_MAC,
    aggregation_frame,
    host_ip,
    host_mac,
    probe_frame,
    udp_frame,
)
from bml.protocol import (
    BML_UDP_PORT,
    CONTROLLER_MAGIC,
    CPU_PORT,
    DEFAULT_WIRE,
    EXPONENT_NONE,
    GENERATION_HALF,
    GENERATIONS,
    DropReason,
    PacketType,
    ResultMode,
    Stat,
    job_udp_port,
    pack_header,
    wire,
)
from control_plane.egress_rewrite import host_address_entry
from control_plane.jobs import AggregationGroup
from control_plane.p4info import Names
from control_plane.session import Entry, entry
from tests.kit import frames as forge
from tests.kit.oracle import Event, Expect, SwitchModel, switch_frame

PORTS = tuple(range(1, 9))
ADDRESSED_PORTS = tuple(range(1, 8))  # port 8 has no host_address: copies to it are counted
FORWARDED_PORTS = tuple(range(1, 7))  # host MACs with an l2_forward entry
UNKNOWN_MAC = bytes.fromhex("02aa00000099")
WIRE = DEFAULT_WIRE  # the switch's width: the default build's
LANES = WIRE.lanes
OTHER_WIRE = wire(256)  # a host of another build


# ---------------------------------------------------------------------------- the scenario
@dataclass(frozen=True)
class Job:
    group: AggregationGroup

    @property
    def job_id(self) -> int:
        return self.group.job_id

    @property
    def workers(self) -> dict[int, int]:
        return self.group.members

    @property
    def to_owner(self) -> bool:
        return self.group.result_mode == ResultMode.TO_OWNER


JOBS = (
    Job(AggregationGroup("dut", 21, {0: 1, 1: 2, 2: 3}, ResultMode.MULTICAST, 0, 3)),
    Job(AggregationGroup("dut", 22, {0: 4, 1: 5, 2: 6}, ResultMode.TO_OWNER, 3, 3)),
    # sparse worker ids, 31 the bitmap's top bit; worker 7 on port 8, which has no
    # host_address
    Job(AggregationGroup("dut", 23, {0: 1, 31: 4, 7: 8}, ResultMode.MULTICAST, 6, 2)),
)
UNKNOWN_JOB = 99


def table_entries() -> list[Entry]:
    """What the scenario installs besides the jobs: host addresses and L2 routes."""
    entries = [host_address_entry(p, host_mac(p), host_ip(p), SWITCH_MAC, SWITCH_IP)
               for p in ADDRESSED_PORTS]
    entries += [entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": int.from_bytes(host_mac(p),
                                                                                "big")},
                      Names.FORWARD_TO, port=p) for p in FORWARDED_PORTS]
    return entries


# ---------------------------------------------------------------------------- the sequence
@dataclass
class Round:
    """One use of a slot: its offset, owner and every worker's contribution."""

    job: Job
    slot: int
    use: int
    offset: int
    owner: int
    generation: int  # the call's
    exponents: dict[int, int]
    values: dict[int, tuple[int, ...]]
    sent: dict[int, bytes] = field(default_factory=dict)  # worker -> its first frame
    contributed: list[int] = field(default_factory=list)
    moved: set[int] = field(default_factory=set)  # workers now in the slot's next round
    resendable: bool = True  # False once a RESET emptied the copy under it

    @property
    def version(self) -> int:
        return self.use % 2

    @property
    def complete(self) -> bool:
        return len(self.contributed) == len(self.job.workers)


class Generator:
    """Builds the event sequence; its state is what the hosts and the controller know."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.events: list[Event] = []
        self.offsets = iter(range(64, 1 << 32, 64 * 7))
        self.rounds: dict[tuple[int, int], Round] = {}
        self.previous: dict[tuple[int, int], Round] = {}
        self.ident = 0
        self.decks: dict[tuple[str, ...], list[str]] = {}
        self.call_generation = {job.job_id: 0 for job in JOBS}  # what the hosts' call uses
        self.model = SwitchModel((job.job_id for job in JOBS), ADDRESSED_PORTS)
        for job in JOBS:
            for slot in range(job.group.pool_size):
                self.rounds[job.job_id, slot] = self._new_round(job, slot, 0)

    # ------------------------------------------------------------------ helpers
    def _new_round(self, job: Job, slot: int, use: int) -> Round:
        rng = self.rng
        workers = sorted(job.workers)
        owner = rng.choice(workers)
        if job.to_owner:  # 200 has no owner_route: the completed sum is dropped, NO_OWNER
            owner = int(self._deal(tuple(str(w) for w in [*workers, 200])))
        big = rng.random() < 0.3  # full-range values: the sums wrap
        bound = (1 << 31) - 1 if big else 1 << 20
        values = {w: tuple(rng.randint(-bound - 1, bound) if rng.random() < 0.9 else 0
                           for _ in range(LANES)) for w in workers}
        exponents = {w: rng.choice((EXPONENT_NONE, rng.randint(1, 255))) for w in workers}
        return Round(job, slot, use, next(self.offsets), owner,
                     self.call_generation[job.job_id], exponents, values)

    def _deal(self, kinds: tuple[str, ...]) -> str:
        """The next of ``kinds`` from a shuffled deck: every kind comes up within a few
        hundred packets, in a seeded order."""
        deck = self.decks.setdefault(kinds, [])
        if not deck:
            deck.extend(kinds)
            self.rng.shuffle(deck)
        return deck.pop()

    def _poison(self) -> tuple[int, ...]:
        return tuple(self.rng.randint(-(1 << 31), (1 << 31) - 1)
                     for _ in range(LANES))

    def _ip_fields(self) -> dict[int, int]:
        """Varying IPv4 fields a result must copy (TOS, identification, DF, the reserved
        flag: neither target looks at it)."""
        self.ident = (self.ident + self.rng.randint(1, 999)) & 0xFFFF
        return {"tos": self.rng.choice((0, 0, 0x10, 0xB8, 0x03)), "ident": self.ident,
                "flags": self.rng.choice((0, 0, 0x4000, 0x8000)),
                "ttl": self.rng.choice((64, 1, 255))}

    def _bml_fields(self) -> dict[int, int]:
        """A BML field the switch copies but does not act on: ``generation``, which a
        BROADCAST does not use (a contribution's is its round's). (``count`` is the switch's
        blocks, which aggregation_frame writes.)"""
        return {"generation": self.rng.choice((0, 0, 0, self.rng.randrange(1 << 16)))}

    def _frame(self, rnd: Round, worker: int, values: tuple[int, ...] | None = None,
               **overrides: int) -> bytes:
        job = rnd.job
        fields: dict = {"exponent": rnd.exponents[worker], "owner": rnd.owner}
        fields.update(self._ip_fields())
        fields.update(self._bml_fields())
        fields["generation"] = rnd.generation
        fields.update(overrides)
        port = fields.pop("port", job.workers.get(worker, 1))
        return aggregation_frame(port, job.job_id, worker, rnd.slot, rnd.version, rnd.offset,
                                 values if values is not None else rnd.values[worker], **fields)

    def _add(self, what: str, port: int, frame: bytes, expect: Expect,
             magic: int = CONTROLLER_MAGIC) -> None:
        self.events.append(Event(len(self.events), what, port, frame, expect, magic))

    def _answer(self, rnd: Round, trigger: bytes, ptype: int, expect: Expect,
                ports: list[int]) -> None:
        """A completed round's sum leaves (RESULT or RESULT_RETX), or NO_OWNER drops it."""
        self.model.answer(rnd.job.workers, rnd.job.to_owner,
                          [(rnd.values[w], rnd.exponents[w]) for w in rnd.contributed],
                          trigger, ptype, expect, ports)

    # ------------------------------------------------------------------ actions
    def contribute(self, job: Job | None = None) -> None:
        """A worker's first contribution to its slot's current round (the last one of the
        round gets the sum to the group)."""
        job = job or self.rng.choice(JOBS)
        slot = self.rng.randrange(job.group.pool_size)
        rnd = self.rounds[job.job_id, slot]
        if rnd.complete:
            self.previous[job.job_id, slot] = rnd
            rnd = self.rounds[job.job_id, slot] = self._new_round(job, slot, rnd.use + 1)
        worker = self.rng.choice([w for w in job.workers if w not in rnd.contributed])
        frame = self._frame(rnd, worker)
        if self.rng.random() < 0.05:  # the IPv4 checksum is not checked (docs/PROTOCOL.md)
            frame = frame[:24] + bytes([frame[24] ^ 0x5A]) + frame[25:]
        old = self.model.admitted(job.job_id, rnd.generation, frame, job.workers[worker])
        if old is not None:  # the switch is at a newer generation (after a RESET): not added
            self._add(f"old call j{job.job_id} s{slot} w{worker}", job.workers[worker], frame,
                      old)
            return
        rnd.sent[worker] = frame
        rnd.contributed.append(worker)
        expect = Expect(stats=Counter({Stat.AGGREGATED: 1}))
        if rnd.complete:
            expect.stats[Stat.COMPLETED] += 1
            self._answer(rnd, frame, PacketType.RESULT, expect, sorted(job.workers.values()))
        previous = self.previous.get((job.job_id, slot))
        if previous is not None:  # its bit leaves the other copy: no more answers from there
            previous.moved.add(worker)
        self._add(f"data j{job.job_id} s{slot} u{rnd.use} w{worker}", job.workers[worker],
                  frame, expect)

    def resend(self) -> None:
        """A contribution sent again: answered PENDING (header only, the count so far) to that
        worker while its round fills, the stored sum back to that worker once it completed
        (while the worker's bit is still in that copy), and a duplicate once the worker moved
        on (a late copy overtaken in the network), also once every worker moved on; of an
        older call: answered with the generation."""
        choices = []
        for rnd in self.rounds.values():
            if rnd.resendable:
                choices += [(rnd, w) for w in rnd.contributed]
        for rnd in self.previous.values():
            if rnd.resendable:
                choices += [(rnd, w) for w in rnd.contributed]
        if not choices:
            return self.contribute()
        rnd, worker = self.rng.choice(choices)
        # A re-send: fresh IPv4 fields; sometimes other values, which must change nothing, or
        # another owner (the answer goes where the re-send's owner_id says).
        overrides = {}
        if rnd.job.to_owner and self.rng.random() < 0.3:
            overrides["owner"] = self.rng.choice([*rnd.job.workers, 200])
        frame = self._frame(rnd, worker, self._poison() if self.rng.random() < 0.3 else None,
                            **overrides)
        old = self.model.admitted(rnd.job.job_id, rnd.generation, frame, rnd.job.workers[worker])
        if old is not None:
            expect, what = old, "old call"
        elif worker in rnd.moved:
            expect = Expect(stats=Counter({Stat.DUPLICATE: 1}))
            what = "late copy"
        elif rnd.complete:
            expect = Expect(stats=Counter({Stat.RETX_ANSWERED: 1}))
            self._answer(rnd, frame, PacketType.RESULT_RETX, expect, [rnd.job.workers[worker]])
            what = "retx"
        else:
            expect = Expect(stats=Counter({Stat.PENDING: 1}))
            port = rnd.job.workers[worker]
            self.model.deliver(expect, port, switch_frame(frame, port, PacketType.PENDING,
                                                          frame[50], None,
                                                          count=len(rnd.contributed)))
            what = "pending"
        self._add(f"{what} j{rnd.job.job_id} s{rnd.slot} u{rnd.use} w{worker}",
                  rnd.job.workers[worker], frame, expect)

    def probe(self) -> None:
        """A PROBE (header only) of a round's copy: PENDING while the round fills and the
        worker is in it, MISSING (the count so far) while it is not, and once it moved on (its
        bit left that copy), the stored sum once complete; of another call than the job's:
        answered with the generation (a probe never makes a call the job's). Never added."""
        choices = [(rnd, w) for rnd in self.rounds.values() if rnd.resendable and rnd.contributed
                   for w in rnd.job.workers]
        choices += [(rnd, w) for rnd in self.previous.values() if rnd.resendable
                    for w in rnd.contributed]
        if not choices:
            return self.contribute()
        rnd, worker = self.rng.choice(choices)
        job, port = rnd.job, rnd.job.workers[worker]
        frame = probe_frame(port, job.job_id, worker, rnd.slot, rnd.version, rnd.offset,
                            owner=rnd.owner, generation=rnd.generation, count=WIRE.blocks,
                            **self._ip_fields())
        if rnd.generation != self.model.generation[job.job_id]:
            expect, what = self.model.generation_answer(job.job_id, frame, port,
                                                        Stat.OLD_CALL), "probe old call"
        elif worker in rnd.contributed and worker not in rnd.moved and rnd.complete:
            expect = Expect(stats=Counter({Stat.RETX_ANSWERED: 1}))
            self._answer(rnd, frame, PacketType.RESULT_RETX, expect, [port])
            what = "probe retx"
        else:
            found = worker in rnd.contributed and worker not in rnd.moved
            stat, ptype = ((Stat.PENDING, PacketType.PENDING) if found
                           else (Stat.MISSING, PacketType.MISSING))
            expect = Expect(stats=Counter({stat: 1}))
            self.model.deliver(expect, port, switch_frame(frame, port, ptype, frame[50], None,
                                                          count=len(rnd.contributed)))
            what = f"probe {ptype.name.lower()}"
        self._add(f"{what} j{job.job_id} s{rnd.slot} u{rnd.use} w{worker}", port, frame, expect)

    def _open_round(self) -> tuple[Round, int] | None:
        """A round in progress and a worker that has not contributed to it yet: what a bad
        packet impersonates, so that admitting it would change the round's sum."""
        rounds = [r for r in self.rounds.values() if not r.complete]
        if not rounds:
            return None
        rnd = self.rng.choice(rounds)
        return rnd, self.rng.choice([w for w in rnd.job.workers if w not in rnd.contributed])

    def stale(self) -> None:
        """A contribution with another offset into a copy that is filling: STALE; or from a
        worker already in the round: a duplicate (never admitted either way)."""
        rounds = [r for r in self.rounds.values() if r.contributed and not r.complete]
        if not rounds:
            return self.contribute()
        rnd = self.rng.choice(rounds)
        worker = self.rng.choice(sorted(rnd.job.workers))
        offset = self.rng.choice((rnd.offset - 64 * 7 * len(self.rounds), 0xFFFFFFFF,
                                  rnd.offset + 64))
        frame = aggregation_frame(rnd.job.workers[worker], rnd.job.job_id, worker, rnd.slot,
                                  rnd.version, offset & 0xFFFFFFFF, self._poison(),
                                  owner=rnd.owner, generation=rnd.generation,
                                  **self._ip_fields())
        old = self.model.admitted(rnd.job.job_id, rnd.generation, frame, rnd.job.workers[worker])
        if old is not None:
            expect = old
        elif worker in rnd.contributed:
            expect = Expect(stats=Counter({Stat.DUPLICATE: 1}))
        else:
            expect = self.model.drop(DropReason.STALE)
        self._add(f"stale j{rnd.job.job_id} s{rnd.slot} w{worker}", rnd.job.workers[worker],
                  frame, expect)

    def forged(self) -> None:
        """One admission fault in an otherwise plausible contribution (poison values)."""
        found = self._open_round()
        if found is None:
            return self.contribute()
        rnd, worker = found
        job, rng = rnd.job, self.rng
        poison = self._poison()
        port = job.workers[worker]
        kind = self._deal(("job", "worker", "port", "slot", "count", "width", "type", "version",
                           "reset", "magic", "cpu-job", "cpu-data", "cpu-tail", "cpu-short",
                           "cpu-wide"))
        if kind == "job":
            frame = aggregation_frame(port, UNKNOWN_JOB, worker, rnd.slot, rnd.version,
                                      rnd.offset, poison)
            self._add("forged unknown job", port, frame, self.model.drop(DropReason.UNKNOWN_JOB))
        elif kind == "worker":
            forged = rng.choice([w for w in (4, 5, 6, 31, 32, 200) if w not in job.workers])
            frame = self._frame(rnd, worker, poison, port=port)
            frame = frame[:46] + bytes([forged]) + frame[47:]
            self._add(f"forged worker {forged}", port, frame,
                      self.model.drop(DropReason.FORGED_WORKER))
        elif kind == "port":
            other = rng.choice([p for p in PORTS if p != port])
            frame = self._frame(rnd, worker, poison, port=other)
            self._add(f"wrong port {other}", other, frame, self.model.drop(DropReason.WRONG_PORT))
        elif kind == "slot":
            frame = aggregation_frame(port, job.job_id, worker,
                                      job.group.pool_size + rng.randrange(3), rnd.version,
                                      rnd.offset, poison)
            self._add("bad slot", port, frame, self.model.drop(DropReason.BAD_SLOT))
        elif kind == "count":  # the switch's length, another count
            count = rng.choice([c for c in (0, 1, OTHER_WIRE.blocks, 255, rng.randrange(256))
                                if c != WIRE.blocks])
            ptype = rng.choice((PacketType.DATA, PacketType.DATA, PacketType.BROADCAST))
            frame = self._frame(rnd, worker, poison, count=count, ptype=ptype)
            self._add("bad width", port, frame, self.model.drop(DropReason.BAD_WIDTH))
        elif kind == "width":  # a host of another build: its own length and count
            values = (poison * (OTHER_WIRE.lanes // LANES + 1))[:OTHER_WIRE.lanes]
            if rng.random() < 0.5:
                frame = self._frame(rnd, worker, values)
            else:
                frame = probe_frame(port, job.job_id, worker, rnd.slot, rnd.version,
                                    rnd.offset, generation=rnd.generation,
                                    count=OTHER_WIRE.blocks)
            self._add("another width", port, frame, self.model.drop(DropReason.BAD_WIDTH))
        elif kind == "type":
            ptype = rng.choice((0, PacketType.RESULT, PacketType.RESULT_RETX, PacketType.ACK, 8,
                                255))
            frame = self._frame(rnd, worker, poison, ptype=ptype)
            self._add(f"bad type {ptype}", port, frame, self.model.drop(DropReason.BAD_TYPE))
        elif kind == "version":
            frame = self._frame(rnd, worker, poison)
            frame = frame[:43] + bytes([rng.choice((2, 3, 255))]) + frame[44:]
            self._add("bad version", port, frame, self.model.drop(DropReason.BAD_TYPE))
        elif kind == "reset":
            frame = self._frame(rnd, worker, poison, ptype=PacketType.RESET)
            self._add("reset from a port", port, frame, self.model.drop(DropReason.FORGED_CONTROL))
        elif kind == "magic":
            frame = self._frame(rnd, worker, poison, ptype=rng.choice((PacketType.RESET,
                                                                        PacketType.DATA)))
            self._add("packet-out, bad magic", CPU_PORT, frame,
                      self.model.drop(DropReason.FORGED_CONTROL), magic=rng.choice((0, 0xB3C1)))
        elif kind == "cpu-wide":
            # A magic wider than its 16 bits: P4Runtime drops it before the pipeline, so it
            # moves nothing at all.
            frame = aggregation_frame(1, job.job_id, 0, rnd.slot, 0, 0, poison,
                                      ptype=PacketType.RESET)
            self._add("packet-out, magic too wide", CPU_PORT, frame, Expect(),
                      magic=1 << 16 | CONTROLLER_MAGIC)
        elif kind == "cpu-data":
            # The controller's own magic, but a worker's packet: workers are on their ports.
            frame = self._frame(rnd, worker, poison, ptype=rng.choice((PacketType.DATA,
                                                                        PacketType.BROADCAST)))
            self._add("packet-out, a worker's packet", CPU_PORT, frame,
                      self.model.drop(DropReason.WRONG_PORT))
        elif kind in ("cpu-tail", "cpu-short"):
            # A RESET of the round's slot that is not a whole frame: the slot is untouched.
            frame = aggregation_frame(1, job.job_id, 0, rnd.slot, 0, 0, poison,
                                      ptype=PacketType.RESET)
            if kind == "cpu-tail":
                frame += bytes(rng.randint(1, 8))
                expect = self.model.drop(DropReason.BAD_LENGTH)
            else:
                frame = frame[:rng.randint(42, WIRE.frame_bytes - 1)]
                expect = self.model.drop(DropReason.SHORT_PACKET)
            self._add(f"packet-out, reset {kind[4:]}", CPU_PORT, frame, expect)
        else:
            frame = aggregation_frame(port, UNKNOWN_JOB, 0, 0, 0, 0, poison,
                                      ptype=PacketType.RESET)
            self._add("packet-out, unknown job", CPU_PORT, frame,
                      self.model.drop(DropReason.UNKNOWN_JOB))

    def malformed(self) -> None:
        """A contribution of an open round broken at the Ethernet, IPv4 or UDP level: either
        ordinary traffic (docs/PROTOCOL.md: to the switch's MAC no route, to a host's MAC
        forwarded byte for byte) or a counted drop; never aggregated."""
        found = self._open_round()
        if found is None:
            return self.contribute()
        rnd, worker = found
        rng = self.rng
        port = rnd.job.workers[worker]
        frame = self._frame(rnd, worker, self._poison())
        kind = self._deal(("vlan", "qinq", "version", "ihl", "options", "mf", "fragment",
                           "proto", "ip-len", "udp-len", "trailing", "short", "no-udp",
                           "no-ip"))
        drop = None
        if kind in ("vlan", "qinq"):
            tci = rng.choice((0, rng.randrange(1 << 16))).to_bytes(2, "big")  # VID 0: priority
            frame = forge.tagged(frame, tci, qinq=kind == "qinq")
        elif kind == "version":
            frame = forge.ip_version(frame, rng.choice((0, 5, 6, 15)))
        elif kind == "ihl":  # the nibble only: the bytes after 20 are what they were
            frame = forge.ip_ihl(frame, rng.choice((0, 4, 6, 15)))
        elif kind == "options":
            frame = forge.ip_options(frame, rng.randint(1, 10))
        elif kind == "mf":
            frame = forge.more_fragments(frame)
        elif kind == "fragment":
            frame = forge.fragment_offset(frame, rng.randint(1, 0x1FFF))
        elif kind == "proto":
            frame = forge.ip_protocol(frame, rng.choice((6, 1, 132)))
        elif kind == "ip-len":
            full = 20 + 8 + WIRE.payload_bytes
            frame = forge.ip_length(frame, rng.choice((44, full - 1, full + 1, 9000, 0)))
            drop = DropReason.BAD_LENGTH
        elif kind == "udp-len":
            full = 8 + WIRE.payload_bytes
            frame = forge.udp_length(frame, rng.choice((24, full - 1, full + 1, 8, 0xFFFF)))
            drop = DropReason.BAD_LENGTH
        elif kind == "trailing":
            frame = frame + bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
            drop = DropReason.BAD_LENGTH
        elif kind == "short":
            frame = frame[:rng.randint(42, WIRE.frame_bytes - 1)]
            drop = DropReason.SHORT_PACKET
        elif kind == "no-udp":  # too short for a UDP header: nothing says it is for the switch
            frame = frame[:rng.randint(34, 41)]
        else:  # IPv4 type, not even a whole IPv4 header (BMv2's parser stops with an error)
            frame = frame[:rng.randint(14, 33)]
        if drop is not None:
            expect = self.model.drop(drop)
        elif rng.random() < 0.4:  # to a host: forwarded, and not rewritten
            target = rng.choice(FORWARDED_PORTS)
            frame = host_mac(target) + frame[6:]
            expect = Expect(stats=Counter({Stat.FORWARDED: 1}), outputs=[(target, frame)])
            kind += " to a host"
        else:
            expect = self.model.no_entry(frame)
        self._add(f"malformed {kind}", port, frame, expect)

    def ordinary(self) -> None:
        """Traffic that is not to the aggregation port, from a host or the controller (a
        PacketOut goes through the same tables): forwarded unchanged by MAC."""
        rng = self.rng
        src = rng.choice((*PORTS, CPU_PORT))
        src_mac, src_ip = (SWITCH_MAC, SWITCH_IP) if src == CPU_PORT else (host_mac(src),
                                                                            host_ip(src))
        known = rng.random() < 0.7
        dst_port = rng.choice(FORWARDED_PORTS)
        dst = host_mac(dst_port) if known else rng.choice((UNKNOWN_MAC, SWITCH_MAC))
        kind = self._deal(("udp", "arp", "raw", "ipv4-options"))
        if kind == "udp":
            size = rng.choice((rng.randint(0, 300), rng.randint(1400, 8900)))  # veths: MTU 9000
            payload = bytes(rng.randrange(256) for _ in range(size))
            sport = rng.randint(1, 65535)
            dport = rng.choice((53, 40021, BML_UDP_PORT - 1))
            frame = udp_frame(dst, src_mac, src_ip, host_ip(2), sport, dport, payload, ident=7,
                              udp_checksum=rng.randrange(1 << 16))
            if rng.random() < 0.3:  # a wrong IPv4 checksum: not checked, not rewritten
                frame = frame[:24] + bytes([frame[24] ^ 0xFF]) + frame[25:]
        elif kind == "arp":
            frame = dst + src_mac + b"\x08\x06" + bytes(rng.randrange(256)
                                                               for _ in range(28))
        elif kind == "raw":
            frame = dst + src_mac + bytes(rng.randrange(256)
                                                for _ in range(rng.randint(2, 120)))
            if frame[12:14] in (b"\x08\x00", b"\x81\x00", b"\x88\xa8", b"\x91\x00"):
                frame = frame[:12] + b"\x86\xdd" + frame[14:]  # IPv4 and tags: cases above
        else:  # options and a wrong checksum: both must leave unchanged
            ip = bytes([0x46]) + bytes(rng.randrange(256) for _ in range(23))
            frame = dst + src_mac + b"\x08\x00" + ip + bytes(16)
        if known:
            expect = Expect(stats=Counter({Stat.FORWARDED: 1}), outputs=[(dst_port, frame)])
        else:
            expect = self.model.no_entry(frame)
        self._add(f"ordinary {kind}", src, frame, expect)

    def broadcast(self) -> None:
        """A worker's BROADCAST: to the group's other members, unchanged but re-addressed."""
        job = self.rng.choice(JOBS)
        worker = self.rng.choice(sorted(job.workers))
        port = job.workers[worker]
        values = self._poison()
        exponent = self.rng.randint(0, 255)
        frame = aggregation_frame(port, job.job_id, worker, self.rng.randrange(
            job.group.pool_size), self.rng.randint(0, 1), self.rng.randrange(1 << 32), values,
            exponent=exponent, owner=self.rng.randrange(256), ptype=PacketType.BROADCAST,
            **self._ip_fields(), **self._bml_fields())
        expect = Expect(stats=Counter({Stat.BROADCAST: 1}))
        others = [p for p in sorted(job.workers.values()) if p != port]
        self.model.copies(frame, PacketType.BROADCAST, exponent, WIRE.values_struct.pack(*values),
                     expect, others, None)
        self._add(f"broadcast j{job.job_id} w{worker}", port, frame, expect)

    def reset(self) -> None:
        """The controller's RESET of one slot (both copies): a round in progress starts over
        (its workers send again); a completed one can no longer be answered."""
        job = self.rng.choice(JOBS)
        slot = self.rng.randrange(job.group.pool_size)
        rnd = self.rounds[job.job_id, slot]
        frame = aggregation_frame(1, job.job_id, 0, slot, 0, 0, (0,) * LANES,
                                  ptype=PacketType.RESET)
        frame = SWITCH_MAC + SWITCH_MAC + frame[12:]
        self.model.generation[job.job_id] = 0  # a RESET sets the job up afresh
        if rnd.complete:
            rnd.resendable = False
        else:
            rnd.contributed.clear()
            rnd.sent.clear()
        previous = self.previous.get((job.job_id, slot))
        if previous is not None:
            previous.resendable = False
        self._add(f"reset j{job.job_id} s{slot}", CPU_PORT, frame,
                  Expect(stats=Counter({Stat.RESET: 1})))

    def generation(self) -> None:
        """A worker asks for its job's generation; a worker of an older call contributes
        (answered, not added); or the job's hosts start a new call (a newer generation): every
        round in progress is abandoned, and the new call's first contribution leaves what the
        old call left in its slot behind."""
        rng = self.rng
        job = rng.choice(JOBS)
        worker = rng.choice(sorted(job.workers))
        port = job.workers[worker]
        kind = self._deal(("query", "old", "new call"))
        current = self.model.generation[job.job_id]
        if kind == "query":
            # The header alone, with the asker's blocks (any count: a host of another width
            # asks too); the answer says the switch's. With lanes it is no question.
            header = pack_header(PacketType.GENERATION, job.job_id, worker,
                                 rng.randrange(job.group.pool_size), rng.randint(0, 1),
                                 rng.randrange(256), rng.randrange(256),
                                 rng.choice((WIRE.blocks, OTHER_WIRE.blocks, rng.randrange(256))),
                                 rng.randrange(1 << 32), rng.randrange(1 << 16))
            lanes = rng.random() < 0.1
            frame = udp_frame(SWITCH_MAC, host_mac(port), host_ip(port), SWITCH_IP,
                              job_udp_port(job.job_id), BML_UDP_PORT,
                              header + (WIRE.zero_lanes if lanes else b""), **self._ip_fields())
            expect = (self.model.drop(DropReason.BAD_LENGTH) if lanes else
                      self.model.generation_answer(job.job_id, frame, port, Stat.GENERATION))
            self._add(f"generation query{' with lanes' if lanes else ''} j{job.job_id} "
                      f"w{worker}", port, frame, expect)
        elif kind == "old":
            older = (current - rng.choice((1, 2, rng.randint(1, GENERATION_HALF - 1)))) \
                % GENERATIONS
            frame = aggregation_frame(port, job.job_id, worker,
                                      rng.randrange(job.group.pool_size), rng.randint(0, 1),
                                      rng.randrange(1 << 32), self._poison(),
                                      exponent=rng.randrange(256), generation=older,
                                      **self._ip_fields())
            self._add(f"old call j{job.job_id} w{worker}", port, frame,
                      self.model.admitted(job.job_id, older, frame, port))
        else:
            # Small steps: 16-bit generations repeat only after 65,536 of them (PTF's
            # generation.GenerationsWrapAround holds the wrap-around).
            step = rng.choice((1, 1, 2, 3, 1000))
            self.call_generation[job.job_id] = (max(
                self.call_generation[job.job_id], current, key=lambda g: (g - current)
                % GENERATIONS) + step) % GENERATIONS
            for slot in range(job.group.pool_size):
                old = self.rounds[job.job_id, slot]
                # An abandoned round is never re-sent: after a RESET (generation 0) its frames
                # would be newer again and restart its copy (its workers' bits were cleared
                # when they moved on), which no host does once it has moved on.
                old.resendable = old.resendable and old.complete
                self.previous[job.job_id, slot] = old
                self.rounds[job.job_id, slot] = self._new_round(job, slot, old.use + 1)
            self.contribute(job)
            self.events[-1].what = "new call " + self.events[-1].what

    def control(self) -> None:
        """The controller changes l2_forward's default entry (a P4Runtime write, no packet):
        to forward_to a port, or back to the program's no_route."""
        if self.model.l2_default is None:
            self.model.l2_default = self.rng.choice(PORTS)
            what = f"control l2_forward default forward_to {self.model.l2_default}"
        else:
            self.model.l2_default = None
            what = "control l2_forward default no_route"
        self.events.append(Event(len(self.events), what, 0, b"", Expect(), control=True,
                                 l2_default=self.model.l2_default))

    ACTIONS = (("contribute", 40), ("resend", 14), ("probe", 6), ("stale", 6), ("forged", 12),
               ("malformed", 14), ("ordinary", 6), ("broadcast", 4), ("reset", 2),
               ("generation", 4), ("control", 1))

    def generate(self, packets: int) -> list[Event]:
        """Actions dealt from a shuffled deck that holds each as often as its weight: every
        action comes up in every hundred events, in a seeded order."""
        deck = tuple(name for name, weight in self.ACTIONS for _ in range(weight))
        while len(self.events) < packets:
            getattr(self, self._deal(deck))()
        return self.events[:packets]


def generate(seed: int, packets: int) -> list[Event]:
    """``packets`` events of the seeded sequence (the same seed gives the same bytes)."""
    return Generator(seed).generate(packets)

