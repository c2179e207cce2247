"""Hostile traffic at the switches while a push runs: random, malformed and forged frames sent
into every switch from the servers' own NICs while every worker pushes a known gradient. No
switch may crash, every sum must be right, and every frame the pipeline must drop must be
counted under its reason (docs/PROTOCOL.md, "Drop reasons").

    .venv/bin/python -m tests.hostile --packets 100000 --target soft       # star:4, as root
    .venv/bin/python -m tests.hostile --packets 100000 --target bmv2 --topo bcube:2,2

What a run does: brings up an emulation (``emulation.net``; star:4 by default, bcube:2,2
too), sets up job 1 on every switch (a scheduled job, pushed ``in-network`` so every switch
aggregates) and a second job 2 on some ports of the first level-0 switch (its pool beside job
1's; on star:4 ports 1-2, on bcube:2,2 port 1 only); pushes a known gradient from every server
on all its NICs once, undisturbed: that sum is the reference; asks each switch (a GENERATION
question, which any worker may ask) which generation each job is at; builds N hostile frames
(seeded); then pushes the same gradient again and again (``bml-host push`` in every server's
namespace) while the frames go into the switches through AF_PACKET sockets on the servers'
NICs, opened in their namespaces. The sender keeps at most ``--window`` frames per switch
that have not moved a counter yet (read over P4Runtime), so no frame is lost in a queue
before the pipeline; frames are pre-built and sent with plain ``send`` calls. At the end:

* every push of the loop exited 0 with a sum within the quantiser's bound and bit for bit the
  reference (the switches add exact integers, so a clean call always gives the same bits);
* every switch process is alive and answers P4Runtime;
* per switch and counter: every drop reason rose by exactly the number of hostile frames of
  that reason (no legitimate frame of a push is dropped), except ``NO_ROUTE``, which the
  hosts' own ICMP errors also reach (at least); ``OLD_CALL`` and ``GENERATION`` by at least
  the hostile ones (the workers ask too); job 2's contributions moved ``AGGREGATED``,
  ``DUPLICATE``, ``RETX_ANSWERED`` or ``PENDING`` (at least as many). The table prints every one.

Threat model. The switch knows a worker only by (job, worker id, ingress port): whoever can
put frames on a worker's link speaks for that worker, as in SwitchML (no authentication in the
data plane). So a ``DATA`` frame that passes admission (the job's worker id, from the port that
worker is attached to) and carries the job's current generation is, to the switch, that
worker's contribution, whatever its slot, version and offset: into an empty copy (or one an
older call left) it starts the copy afresh with its own values and offset. A newer generation
from there restarts the worker's live call, and a ``BROADCAST`` from there is multicast to the
job. The generator sends none of these for the job being pushed (the "impersonates the worker"
case). That case is wider than "exactly the worker's next contribution": a current-generation
DATA from the worker's port and id with another offset, into an empty copy, is aggregated,
and the round it lands in can then never complete (the other workers' real contributions are
STALE, the worker's own a duplicate, re-sends too) until a newer call abandons it. Everything
else must be harmless, and is what it sends, every frame addressed to the switch (its MAC, or
an unknown one; frames the switch forwards unchanged to a host's MAC are the hosts' business):

* dropped with a counted reason before any slot is touched: random bytes and random IPv4,
  802.1Q-tagged contributions, wrong UDP ports, fragments, IP options, other protocols
  (ordinary traffic to an unknown MAC: ``NO_ROUTE``); truncated (``SHORT_PACKET``), trailing
  bytes or wrong IPv4/UDP lengths (``BAD_LENGTH``); contributions whose ``count`` is not the
  switch's blocks, a host of another width's (``BAD_WIDTH``); types a host may not send
  and ``version`` > 1 (``BAD_TYPE``); unknown jobs; slots outside the job's pool, among them
  the indices where the other job's slots are (``BAD_SLOT``); ``RESET`` from a host
  (``FORGED_CONTROL``); ids no worker of the job has (``FORGED_WORKER``); another worker's id
  from this port, and ``BROADCAST`` from a port that is not the job's (``WRONG_PORT`` /
  ``FORGED_WORKER``). These carry, where a field is not the fault, what the push's own frames
  carry: its job, the sender's own id, a slot of the pool, the generation the pushes use;
* answered with the job's generation and not added: contributions of older calls (generations
  1..1000 behind the job's: ``OLD_CALL``) and generation questions (``GENERATION``), from the
  workers' own ports and ids;
* confined to the other job: contributions to job 2's slots from job 2's own ports and ids
  (what job 2's workers may send; nobody pushes job 2).

``check_in_process`` runs the same frames through the software target's pipeline in this
process (no root) and checks that each moves exactly the counter its class names.

This module is the scenario, the hostile frames' generator, the push loop and the CLI; the
frame layout is ``bml.frames``, the malformations ``tests.kit.frames``, the namespaces,
counters and emulation ``tests.kit``.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bml.frames import ip_bytes, mac_bytes, read_header, udp_frame, udp_ports
from bml.protocol import (
    BML_UDP_PORT,
    DEFAULT_WIRE,
    GENERATIONS,
    HEADER_BYTES,
    HEADER_STRUCT,
    JOB_UDP_PORT_BASE,
    MAX_WORKERS,
    PRIMING_OFFSET,
    DropReason,
    PacketType,
    Stat,
    Wire,
    generation_question,
    wire,
)
from bml.schedule import IN_NETWORK
from bml.topology import Topology
from control_plane.jobs import AggregationGroup, plan_job, plan_scheduled_job
from tests.kit import frames as forge
from tests.kit import namespaces
from tests.kit.counters import SwitchCounters, counter_keys, key_value
from tests.kit.targets import InProcessSwitch, emulation

JOB = 1  # the job being pushed (a scheduled job: switch job ids 1 + 512 * stripe)
OTHER_JOB = 2  # the second job, idle: hostile frames aim at its slots
OTHER_POOL = 64
# Hostile frames per switch sent and not yet counted, and the pushes' window (bml-host push
# --window), per target. BMv2 reads its ports through libpcap, whose capture ring (2 MiB of
# slots as large as the biggest frame the port may carry) takes about 240 frames back to back
# on one port at the emulation's MTU of 9000 (offloads off; 32 with a veth's offloads on):
# more in flight on one port and frames are lost before the pipeline, counted nowhere a
# controller sees (the push repairs its own by re-sending; a lost hostile frame would leave
# its count short). The software target's sockets take thousands.
WINDOW = {"soft": 256, "bmv2": 32}
PUSH_WINDOW = {"soft": 256, "bmv2": 32}
OLD_BY = 1000  # old calls are 1..OLD_BY generations behind the job's
MAX_FRAME = 9014  # the emulation's veths have MTU 9000
# The types a host sends: in a full frame, a GENERATION question as the header alone (a PROBE
# too: full, it is BAD_LENGTH).
HOST_TYPES = (PacketType.DATA, PacketType.BROADCAST, PacketType.RESET, PacketType.GENERATION)
# What a contribution's count must say: the switch's blocks (its type one of these).
CONTRIBUTIONS = (PacketType.DATA, PacketType.BROADCAST, PacketType.RESET, PacketType.PROBE)


def not_a_probe(ptype: int) -> int:
    """Any type but PROBE's, which is checked for its own length before the type."""
    return ptype + 1 if ptype == PacketType.PROBE else ptype
_IPV4_LIKE = (0x0800, 0x8100, 0x88A8, 0x9100)  # EtherTypes the random-bytes class avoids

# What each class of hostile frame must move, one counter key per class: "drop:REASON",
# "stat:OLD_CALL", "stat:GENERATION" or "stat:ADMITTED" (AGGREGATED, DUPLICATE,
# RETX_ANSWERED or PENDING: a contribution to the other job).
CLASSES: dict[str, str] = {
    "random bytes": "drop:NO_ROUTE",
    "random IPv4": "drop:NO_ROUTE",
    "802.1Q-tagged contribution": "drop:NO_ROUTE",
    "wrong UDP port": "drop:NO_ROUTE",
    "fragment, IP options, not UDP": "drop:NO_ROUTE",
    "truncated": "drop:SHORT_PACKET",
    "trailing bytes (oversized)": "drop:BAD_LENGTH",
    "wrong IPv4/UDP length": "drop:BAD_LENGTH",
    "another width": "drop:BAD_WIDTH",
    "type a host may not send": "drop:BAD_TYPE",
    "version > 1": "drop:BAD_TYPE",
    "unknown job": "drop:UNKNOWN_JOB",
    "slot outside the pool": "drop:BAD_SLOT",
    "RESET from a host": "drop:FORGED_CONTROL",
    "forged worker id": "drop:FORGED_WORKER",
    "another worker's id": "drop:WRONG_PORT",
    "BROADCAST, not a member's port": "drop:WRONG_PORT",
    "BROADCAST, not a member's id": "drop:FORGED_WORKER",
    "old call": "stat:OLD_CALL",
    "generation question": "stat:GENERATION",
    "other job's slots": "stat:ADMITTED",
}
# The Generator method that builds each class.
BUILDERS: dict[str, str] = {
    "random bytes": "_random_bytes",
    "random IPv4": "_random_ipv4",
    "802.1Q-tagged contribution": "_tagged",
    "wrong UDP port": "_wrong_udp_port",
    "fragment, IP options, not UDP": "_not_for_the_pipeline",
    "truncated": "_truncated",
    "trailing bytes (oversized)": "_trailing_bytes",
    "wrong IPv4/UDP length": "_wrong_length",
    "another width": "_another_width",
    "type a host may not send": "_bad_type",
    "version > 1": "_bad_version",
    "unknown job": "_unknown_job",
    "slot outside the pool": "_bad_slot",
    "RESET from a host": "_reset_from_a_host",
    "forged worker id": "_forged_worker",
    "another worker's id": "_another_workers_id",
    "BROADCAST, not a member's port": "_broadcast_member_id",
    "BROADCAST, not a member's id": "_broadcast_forged_id",
    "old call": "_old_call",
    "generation question": "_generation_question",
    "other job's slots": "_other_jobs_slots",
}
# Counters that only hostile frames move during a run: their increase must be exact.
AT_LEAST = {"drop:NO_ROUTE", "stat:OLD_CALL", "stat:GENERATION", "stat:ADMITTED"}
TRACKED = {f"drop:{r.name}" for r in DropReason} | {"stat:OLD_CALL", "stat:GENERATION"}


def tracked_total(stats: list[int], drops: list[int]) -> int:
    """What every tracked hostile frame moves by one: flow control for the sender."""
    return sum(drops) + stats[Stat.OLD_CALL] + stats[Stat.GENERATION]


# ---------------------------------------------------------------------------- the network
@dataclass(frozen=True)
class Link:
    """One server NIC and the switch port at its other end."""

    server: int
    namespace: str
    interface: str
    switch: str
    port: int
    mac: bytes
    ip: bytes
    switch_mac: bytes
    switch_ip: bytes


def topology_links(topology: Topology,
                   namespace_of: Callable[[int], str] = lambda s: "") -> list[Link]:
    links = []
    for server in range(topology.num_servers):
        for nic in topology.nics(server):
            sw = topology.switch(nic.switch)
            links.append(Link(server, namespace_of(server), nic.interface, sw.name, nic.port,
                              mac_bytes(nic.mac), ip_bytes(nic.ip), mac_bytes(sw.mac),
                              ip_bytes(sw.ip)))
    return links


def other_job_servers(topology: Topology) -> list[int]:
    """Job 2's servers: the first half (at least one) of the first level-0 switch's, so that
    the switch has ports that are not job 2's."""
    servers = topology.switches[0].servers
    return list(servers[:max(1, len(servers) // 2)])


def plan_groups(topology: Topology) -> list[AggregationGroup]:
    """The groups the run sets up (what ``Fabric.add_scheduled_job`` and ``add_job`` plan),
    for the in-process check."""
    pushed = plan_scheduled_job(topology, JOB, IN_NETWORK)
    other = plan_job(topology, OTHER_JOB, other_job_servers(topology), 0, OTHER_POOL,
                     pushed.groups)
    return pushed.groups + other.groups


@dataclass(frozen=True)
class Hostile:
    """One frame: which link sends it, its class and the counter it must move."""

    link: int
    switch: str
    kind: str
    frame: bytes

    @property
    def key(self) -> str:
        return CLASSES[self.kind]

    @property
    def tracked(self) -> bool:
        return self.key in TRACKED


# ---------------------------------------------------------------------------- the generator
class Generator:
    """Seeded hostile frames for ``links``; ``groups``: every job's group on every switch;
    ``generations``: (switch, job id) -> the generation the job is at there; ``chunks``: how
    many chunks (packets of ``wire``'s width, the switches') the pushed gradient has
    (plausible offsets)."""

    def __init__(self, links: list[Link], groups: list[AggregationGroup],
                 generations: dict[tuple[str, int], int], seed: int, chunks: int = 4096,
                 pushed: set[int] | None = None, wire: Wire = DEFAULT_WIRE) -> None:
        self.rng = random.Random(seed)
        self.wire = wire
        self.links = links
        self.generations = generations
        self.chunks = max(1, chunks)
        self.by_switch: dict[str, list[AggregationGroup]] = {}
        for group in groups:
            self.by_switch.setdefault(group.switch, []).append(group)
        pushed = pushed if pushed is not None else {g.job_id for g in groups
                                                    if g.job_id % 512 == JOB}
        self.host_macs = {link.mac for link in links}
        # Per link: the pushed job's groups it is a worker of (its id there), the other jobs'
        # groups it is a worker of, and groups on its switch it is no worker of.
        self.own: list[list[tuple[AggregationGroup, int]]] = []
        self.other: list[list[tuple[AggregationGroup, int]]] = []
        self.foreign: list[list[AggregationGroup]] = []
        for link in links:
            own, other, foreign = [], [], []
            for group in self.by_switch.get(link.switch, []):
                ids = [w for w, p in group.members.items() if p == link.port]
                if not ids:
                    foreign.append(group)
                elif group.job_id in pushed:
                    own.append((group, ids[0]))
                else:
                    other.append((group, ids[0]))
            self.own.append(own)
            self.other.append(other)
            self.foreign.append(foreign)
        everyone = range(len(links))
        self.eligible = {kind: list(everyone) for kind in CLASSES}
        for kind in ("BROADCAST, not a member's port", "BROADCAST, not a member's id"):
            self.eligible[kind] = [i for i in everyone if self.foreign[i]]
        self.eligible["other job's slots"] = [i for i in everyone if self.other[i]]
        self.eligible["another worker's id"] = [
            i for i in everyone if any(len(g.members) > 1 for g, _ in self.own[i])]
        for kind in list(self.eligible):
            if not self.eligible[kind]:
                del self.eligible[kind]  # nothing on this topology can send it
        self.deck: list[str] = []

    # ------------------------------------------------------------------ helpers
    def _kind(self) -> str:
        """The next class from a shuffled deck of every class: equal shares, seeded order."""
        if not self.deck:
            self.deck = list(self.eligible)
            self.rng.shuffle(self.deck)
        return self.deck.pop()

    def _generation(self, group: AggregationGroup) -> int:
        return self.generations.get((group.switch, group.job_id), 0)

    def _current(self, group: AggregationGroup) -> int:
        """A generation a push of the job uses now or soon (the job's, or a few ahead)."""
        return (self._generation(group) + self.rng.choice((0, 1, 1, 2, 3))) % GENERATIONS

    def _random_mac(self) -> bytes:
        while True:
            mac = self.rng.randbytes(6)
            if mac not in self.host_macs:
                return mac

    def _values(self) -> bytes:
        return self.rng.randbytes(self.wire.values_bytes)

    def _offset(self) -> int:
        if self.rng.random() < 0.1:
            return PRIMING_OFFSET
        return self.wire.lanes * self.rng.randrange(self.chunks)

    def _header(self, group: AggregationGroup, worker: int, **fields: int) -> dict[str, int]:
        """A plausible header of ``group``'s job from ``worker``: what its push sends now."""
        rng = self.rng
        header = {"ptype": PacketType.DATA, "version": rng.randint(0, 1), "job": group.job_id,
                  "worker": worker, "owner": rng.choice(sorted(group.members)),
                  "slot": rng.randrange(group.pool_size), "exponent": rng.randint(0, 255),
                  "count": self.wire.blocks,
                  "generation": self._current(group), "offset": self._offset()}
        header.update(fields)
        return header

    def _frame(self, link: Link, header: dict[str, int], values: bytes | None = None, *,
               dport: int = BML_UDP_PORT, ip_len: int | None = None,
               udp_len: int | None = None, dst: bytes | None = None) -> bytes:
        """An aggregation frame from ``link``'s NIC to its switch, UDP from the job's port: the
        header and ``values`` (random lanes of the switch's width unless given; none for a
        GENERATION question), lengths to match unless given."""
        rng = self.rng
        if values is None:
            values = b"" if header["ptype"] == PacketType.GENERATION else self._values()
        udp_len = 8 + HEADER_BYTES + len(values) if udp_len is None else udp_len
        ip_len = 20 + 8 + HEADER_BYTES + len(values) if ip_len is None else ip_len
        job = header["job"]
        sport = JOB_UDP_PORT_BASE + job if JOB_UDP_PORT_BASE + job < 65536 else rng.randrange(
            1024, 65536)
        tos = rng.choice((0, 0, 0x10, 0xB8))
        ident = rng.randrange(65536)
        flags = rng.choice((0, 0x4000))
        bml = HEADER_STRUCT.pack(header["ptype"], header["version"], job, header["worker"],
                                 header["owner"], header["slot"], header["exponent"],
                                 header["count"], header["generation"], header["offset"])
        return udp_frame(dst or link.switch_mac, link.mac, link.ip, link.switch_ip, sport, dport,
                         bml + values, tos=tos,
                         ident=ident, flags=flags, ip_length=ip_len, udp_length=udp_len)

    def _plausible(self, index: int) -> bytes:
        """A frame the pushed job's pipeline would take from this link if nothing were wrong
        with it: own id, own port, a slot of the pool, the pushes' generation."""
        group, worker = self.rng.choice(self.own[index])
        return self._frame(self.links[index], self._header(group, worker))

    def _any_group(self, index: int) -> AggregationGroup:
        return self.rng.choice(self.by_switch[self.links[index].switch])

    # ------------------------------------------------------------------ one frame
    def frame(self) -> Hostile:
        kind = self._kind()
        index = self.rng.choice(self.eligible[kind])
        link = self.links[index]
        return Hostile(index, link.switch, kind, getattr(self, BUILDERS[kind])(index))

    def generate(self, packets: int) -> list[Hostile]:
        return [self.frame() for _ in range(packets)]

    def _random_bytes(self, index: int) -> bytes:
        rng, link = self.rng, self.links[index]
        ethertype = rng.randrange(65536)
        while ethertype in _IPV4_LIKE:
            ethertype = rng.randrange(65536)
        dst = rng.choice((link.switch_mac, self._random_mac()))
        return (dst + rng.randbytes(6) + ethertype.to_bytes(2, "big")
                + rng.randbytes(rng.choice((rng.randint(0, 64), rng.randint(0, 1500)))))

    def _random_ipv4(self, index: int) -> bytes:
        rng, link = self.rng, self.links[index]
        ip = bytearray(rng.randbytes(rng.randint(0, 600)))
        if len(ip) > 9 and ip[0] == 0x45 and ip[9] == 17:
            ip[9] = 6  # never UDP in a header the parser reads: random IPv4 is ordinary traffic
        dst = rng.choice((link.switch_mac, self._random_mac()))
        return dst + rng.randbytes(6) + b"\x08\x00" + bytes(ip)

    def _tagged(self, index: int) -> bytes:
        frame = self._plausible(index)
        tci = self.rng.choice((0, self.rng.randrange(65536))).to_bytes(2, "big")
        return forge.tagged(frame, tci, qinq=self.rng.random() >= 0.7)

    def _wrong_udp_port(self, index: int) -> bytes:
        group, worker = self.rng.choice(self.own[index])
        port = self.rng.choice((BML_UDP_PORT - 1, BML_UDP_PORT + 1, 0, JOB_UDP_PORT_BASE + JOB,
                                self.rng.randrange(65536)))
        if port == BML_UDP_PORT:
            port = BML_UDP_PORT + 2
        return self._frame(self.links[index], self._header(group, worker), dport=port)

    def _not_for_the_pipeline(self, index: int) -> bytes:
        rng = self.rng
        frame = self._plausible(index)
        how = rng.choice(("version", "ihl", "options", "mf", "fragment", "proto"))
        if how == "version":
            return forge.ip_version(frame, rng.choice((0, 5, 6, 15)))
        if how == "ihl":
            return forge.ip_ihl(frame, rng.choice((0, 4, 6, 15)))
        if how == "options":
            return forge.ip_options(frame, rng.randint(1, 10))
        if how == "mf":
            return forge.more_fragments(frame)
        if how == "fragment":
            return forge.fragment_offset(frame, rng.randint(1, 0x1FFF))
        return forge.ip_protocol(frame, rng.choice((1, 6, 47, 132)))

    def _truncated(self, index: int) -> bytes:
        return self._plausible(index)[:self.rng.randint(42, self.wire.frame_bytes - 1)]

    def _trailing_bytes(self, index: int) -> bytes:
        extra = self.rng.choice((self.rng.randint(1, 64), self.rng.randint(1, 1200),
                                 self.rng.randint(1, MAX_FRAME - self.wire.frame_bytes)))
        return self._plausible(index) + self.rng.randbytes(extra)

    def _wrong_length(self, index: int) -> bytes:
        rng = self.rng
        group, worker = rng.choice(self.own[index])
        header = self._header(group, worker)
        udp = 8 + self.wire.payload_bytes
        if rng.random() < 0.5:
            return self._frame(self.links[index], header,
                               ip_len=rng.choice((0, 20, 28, 44, udp + 19, udp + 21, 65535)))
        return self._frame(self.links[index], header,
                           udp_len=rng.choice((0, 8, 24, udp - 1, udp + 1, 9000, 65535)))

    def _another_width(self, index: int) -> bytes:
        # A contribution whose count is not the switch's blocks: checked first, before the
        # lengths, type, version, job, slot and worker, so anything else may be anything. A
        # host of another build: its own count, and its own length or the switch's.
        rng = self.rng
        group, worker = rng.choice(self.own[index])
        other = wire(rng.choice([lanes for lanes in (64, 256, 2208, 32, 96)
                                 if lanes != self.wire.lanes]))
        header = self._header(group, rng.choice((worker, rng.randrange(256))),
                              count=rng.choice((other.blocks, rng.randrange(256))),
                              ptype=rng.choice(CONTRIBUTIONS),
                              version=rng.choice((0, 1, rng.randrange(256))),
                              job=rng.choice((group.job_id, rng.randrange(65536))))
        if header["count"] == self.wire.blocks:
            header["count"] = other.blocks
        if header["ptype"] == PacketType.PROBE:
            values = b""
        else:
            values = rng.randbytes(rng.choice((other.values_bytes, self.wire.values_bytes)))
        return self._frame(self.links[index], header, values)

    def _bad_type(self, index: int) -> bytes:
        rng = self.rng
        group, worker = rng.choice(self.own[index])
        ptype = rng.choice((0, PacketType.RESULT, PacketType.RESULT_RETX, PacketType.ACK,
                            not_a_probe(rng.randint(8, 254))))
        return self._frame(self.links[index], self._header(group, worker, ptype=ptype))

    def _bad_version(self, index: int) -> bytes:
        group, worker = self.rng.choice(self.own[index])
        return self._frame(self.links[index], self._header(
            group, worker, ptype=self.rng.choice(HOST_TYPES),
            version=self.rng.choice((2, 3, self.rng.randint(2, 255)))))

    def _unknown_job(self, index: int) -> bytes:
        rng = self.rng
        installed = {g.job_id for g in self.by_switch[self.links[index].switch]}
        job = rng.choice((0, rng.randint(1, 4095), rng.randrange(65536), JOB + 512 * 7))
        while job in installed:
            job = rng.randrange(65536)
        group, worker = rng.choice(self.own[index])
        return self._frame(self.links[index], self._header(group, worker, job=job,
                                                            ptype=rng.choice(HOST_TYPES)))

    def _bad_slot(self, index: int) -> bytes:
        rng = self.rng
        group = self._any_group(index)
        others = [g for g in self.by_switch[group.switch] if g.pool_base > group.pool_base]
        slot = rng.randint(group.pool_size, 65535)
        if others and rng.random() < 0.5:  # where another job's slots are, seen from this one
            other = rng.choice(others)
            slot = other.pool_base - group.pool_base + rng.randrange(other.pool_size)
        worker = rng.choice(sorted(group.members))
        return self._frame(self.links[index], self._header(
            group, worker, slot=slot, ptype=rng.choice(HOST_TYPES)))

    def _reset_from_a_host(self, index: int) -> bytes:
        group = self._any_group(index)
        worker = self.rng.choice((*sorted(group.members), self.rng.randrange(256)))
        return self._frame(self.links[index], self._header(group, worker,
                                                            ptype=PacketType.RESET))

    def _forged_worker(self, index: int) -> bytes:
        rng = self.rng
        group = self._any_group(index)
        worker = rng.choice((rng.randrange(MAX_WORKERS), rng.randrange(256)))
        while worker in group.members:
            worker = rng.randrange(256)
        return self._frame(self.links[index], self._header(
            group, worker, ptype=rng.choice((PacketType.DATA, PacketType.DATA,
                                             PacketType.BROADCAST, PacketType.GENERATION))))

    def _another_workers_id(self, index: int) -> bytes:
        rng = self.rng
        link = self.links[index]
        group, _ = rng.choice([(g, w) for g, w in self.own[index] if len(g.members) > 1])
        worker = rng.choice([w for w, p in group.members.items() if p != link.port])
        return self._frame(link, self._header(
            group, worker, ptype=rng.choice((PacketType.DATA, PacketType.DATA,
                                             PacketType.BROADCAST, PacketType.GENERATION))))

    def _broadcast_member_id(self, index: int) -> bytes:
        group = self.rng.choice(self.foreign[index])
        worker = self.rng.choice(sorted(group.members))
        return self._frame(self.links[index], self._header(group, worker,
                                                            ptype=PacketType.BROADCAST))

    def _broadcast_forged_id(self, index: int) -> bytes:
        group = self.rng.choice(self.foreign[index])
        worker = self.rng.randrange(256)
        while worker in group.members:
            worker = self.rng.randrange(256)
        return self._frame(self.links[index], self._header(group, worker,
                                                            ptype=PacketType.BROADCAST))

    def _old_call(self, index: int) -> bytes:
        group, worker = self.rng.choice(self.own[index] + self.other[index])
        older = (self._generation(group) - self.rng.choice(
            (1, 2, self.rng.randint(1, OLD_BY)))) % GENERATIONS
        return self._frame(self.links[index], self._header(group, worker, generation=older))

    def _generation_question(self, index: int) -> bytes:
        group, worker = self.rng.choice(self.own[index] + self.other[index])
        return self._frame(self.links[index], self._header(
            group, worker, ptype=PacketType.GENERATION, generation=self.rng.randrange(65536)))

    def _other_jobs_slots(self, index: int) -> bytes:
        # The other job's own workers, its generation, one offset per slot: aggregated there,
        # answered PENDING or with the stored sum; never STALE, never another job's sum.
        group, worker = self.rng.choice(self.other[index])
        slot = self.rng.randrange(group.pool_size)
        return self._frame(self.links[index], self._header(
            group, worker, slot=slot, offset=64 * slot, generation=self._generation(group)))


# ---------------------------------------------------------------------------- in process
def check_in_process(spec: str, packets: int, seed: int) -> tuple[list[Hostile], list[str]]:
    """The frames of ``spec`` through the software target's pipeline here (one per switch,
    provisioned over P4Runtime as the emulation provisions them): what each frame moved
    beside what its class names (exactly: no other traffic here). Returns the frames and the
    differences (empty: the generator classifies every frame as the pipeline does)."""
    from control_plane.provision import install_group, provision_switch

    topology = Topology.parse(spec)
    groups = plan_groups(topology)
    frames = Generator(topology_links(topology), groups, {}, seed).generate(packets)
    pipelines, switches = {}, []
    try:
        for sw in topology.switches:
            switch = InProcessSwitch(sw.name, timeout=10)
            switches.append(switch)
            provision_switch(switch.session, topology, sw)
            for group in groups:
                if group.switch == sw.name:
                    install_group(switch.session, sw, group)
            pipelines[sw.name] = switch.pipeline
        links = topology_links(topology)
        differences = []
        for number, hostile in enumerate(frames):
            pipeline = pipelines[hostile.switch]
            stats, drops = list(pipeline.stats), list(pipeline.drops)
            pipeline.process(links[hostile.link].port, hostile.frame)
            moved = {key: key_value(key, pipeline.stats, pipeline.drops) - key_value(
                key, stats, drops) for key in counter_keys()}
            moved = {k: v for k, v in moved.items() if v}
            if moved != {hostile.key: 1}:
                differences.append(f"frame {number} ({hostile.kind}, {hostile.switch} port "
                                   f"{links[hostile.link].port}): moved {moved}, expected "
                                   f"{hostile.key}: {hostile.frame.hex()}")
        return frames, differences
    finally:
        for switch in reversed(switches):
            switch.close()


# ---------------------------------------------------------------------------- sockets
def send_socket(link: Link) -> socket.socket:
    """A raw socket on the server's NIC that only sends."""
    return namespaces.send_socket(link.namespace, link.interface)


def ask_generation(link: Link, group: AggregationGroup, worker: int,
                   timeout: float = 10.0) -> int:
    """The job's generation at the switch: a GENERATION question from the worker's NIC, as a
    worker asks it; the answer is read off the NIC."""
    sport = 39000 + group.job_id % 1000
    frame = udp_frame(link.switch_mac, link.mac, link.ip, link.switch_ip, sport, BML_UDP_PORT,
                      generation_question(group.job_id, worker, DEFAULT_WIRE), ident=1)
    with (send_socket(link) as out,
          namespaces.receive_socket(link.namespace, link.interface) as into):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out.send(frame)
            asked = time.monotonic()
            while time.monotonic() - asked < 0.5:
                try:
                    got = into.recv(9216)
                except TimeoutError:
                    continue
                header = read_header(got)
                if (header is not None and udp_ports(got) == (BML_UDP_PORT, sport)
                        and header[0] == PacketType.GENERATION and header[2] == group.job_id):
                    return header[8]
    raise RuntimeError(f"switch {group.switch} did not answer a generation question for job "
                       f"{group.job_id} from server {link.server} {link.interface}")


# ---------------------------------------------------------------------------- sending
@dataclass
class SendResult:
    sent: int = 0
    during_push: int = 0  # sent while a push's processes ran
    seconds: float = 0.0
    stalled: list[str] = field(default_factory=list)
    send_errors: int = 0


def send_all(frames: list[Hostile], sockets: list[socket.socket], counters: SwitchCounters,
             window: int, pushing: threading.Event, stall: float = 20.0) -> SendResult:
    """Every frame into its switch, in order per switch, with at most ``window`` tracked
    frames per switch not yet counted (so none waits in a queue long enough to be lost); a
    switch that counts nothing for ``stall`` seconds is given up on (and named)."""
    result = SendResult()
    queues: dict[str, deque[Hostile]] = {}
    for hostile in frames:
        queues.setdefault(hostile.switch, deque()).append(hostile)
    base = {name: tracked_total(*counters.read(name)) for name in queues}
    sent_tracked: Counter[str] = Counter()
    last_progress = {name: (0, time.monotonic()) for name in queues}
    started = time.monotonic()
    while any(queues.values()):
        busy = False
        for name, queue in queues.items():
            if not queue:
                continue
            done = tracked_total(*counters.read(name)) - base[name]
            now = time.monotonic()
            if done != last_progress[name][0]:
                last_progress[name] = (done, now)
            elif now - last_progress[name][1] > stall and sent_tracked[name] > done:
                result.stalled.append(f"{name}: {sent_tracked[name] - done} frames sent were "
                                      f"not counted within {stall:g} s; "
                                      f"{len(queue)} not sent")
                queue.clear()
                continue
            room = window - (sent_tracked[name] - done)
            while queue and room > 0:
                hostile = queue.popleft()
                try:
                    sockets[hostile.link].send(hostile.frame)
                except OSError:  # ENOBUFS: the NIC's queue is full; once more, later
                    result.send_errors += 1
                    queue.appendleft(hostile)
                    break
                result.sent += 1
                result.during_push += pushing.is_set()
                if hostile.tracked:
                    sent_tracked[name] += 1
                    room -= 1
                busy = True
        if not busy:
            time.sleep(0.001)
    # Until every tracked frame sent is counted (bounded).
    deadline = time.monotonic() + stall
    for name in queues:
        while (tracked_total(*counters.read(name)) - base[name] < sent_tracked[name]
               and time.monotonic() < deadline):
            time.sleep(0.01)
    result.seconds = time.monotonic() - started
    return result


# ---------------------------------------------------------------------------- pushing
@dataclass
class PushRecord:
    started: float
    seconds: float
    ok: bool
    problems: list[str]


class PushLoop(threading.Thread):
    """The same push on every server again and again until ``stop`` (the one running then
    finishes); each one's sums checked against the reference, bit for bit and the bound."""

    def __init__(self, state, grads: list[np.ndarray], reference: list[np.ndarray],
                 workdir: Path, extra: list[str], timeout: float) -> None:
        super().__init__(name="push-loop", daemon=True)
        self.state, self.grads, self.reference = state, grads, reference
        self.workdir, self.extra, self.timeout = workdir, extra, timeout
        self.stop = threading.Event()
        self.pushing = threading.Event()
        self.records: list[PushRecord] = []

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.pushing.set()
            try:
                results = push(self.state, self.grads, self.workdir, self.extra, self.timeout)
            finally:
                self.pushing.clear()
            problems = judge(results, self.grads, self.reference)
            self.records.append(PushRecord(started, time.monotonic() - started, not problems,
                                           problems))
            if problems:
                return  # a failed push: the run fails; no more


def push(state, grads: list[np.ndarray], workdir: Path, extra: list[str], timeout: float):
    from emulation.workers import Push, run_pushes

    return run_pushes(state, JOB, [Push(s, s, g, None) for s, g in enumerate(grads)], workdir,
                      len(grads), ["--schedule", IN_NETWORK, *extra], timeout)


def judge(results, grads: list[np.ndarray], reference: list[np.ndarray] | None) -> list[str]:
    """What is wrong with one push on every server (empty: every sum right)."""
    from hosts.quantize import check_sum

    problems = []
    for server, result in enumerate(results):
        if result.returncode != 0:
            problems.append(f"server {server}: exit {result.returncode}: "
                            f"{result.stderr.strip()[-500:]}")
            continue
        total = np.load(result.output)
        error, bound, ok = check_sum(total, grads)
        if not ok:
            problems.append(f"server {server}: error {error} beyond the bound {bound}")
        if reference is not None and not np.array_equal(total, reference[server]):
            differ = int(np.sum(total != reference[server]))
            problems.append(f"server {server}: {differ} elements differ from the reference")
    return problems


def gradients(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size) * 10.0 ** rng.integers(-3, 3, size)).astype(np.float32)
            for _ in range(count)]


# ---------------------------------------------------------------------------- link losses
def link_drops(links: list[Link]) -> int:
    """Frames a server NIC could not hand to its veth peer (its TX dropped): lost before any
    switch saw them. (The switch-side end's RX dropped is no loss: the kernel counts there
    frames no protocol of its own takes, after the switch's raw socket got them.)"""
    return sum(namespaces.interface_drops(link.namespace, link.interface)[1]
               for link in links)


# ---------------------------------------------------------------------------- the run
@dataclass
class Report:
    topology: str
    target: str
    packets: int
    seed: int
    switch_binary: str = ""
    windows: str = ""  # hostile per switch / the pushes'
    classes: dict[str, int] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)  # per counter key, summed over switches
    failures: list[str] = field(default_factory=list)
    pushes: list[dict] = field(default_factory=list)
    send: dict = field(default_factory=dict)
    link_drops: int = 0
    socket_drops: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.failures

    def text(self) -> str:
        lines = [f"hostile traffic: {self.packets} frames (seed {self.seed}) into "
                 f"{self.topology} on {self.target}, windows {self.windows}"
                 + (f" ({self.switch_binary})" if self.switch_binary else "")]
        lines.append(f"  {'class':<32} {'frames':>7}  must move")
        for kind, count in self.classes.items():
            lines.append(f"  {kind:<32} {count:>7}  {CLASSES[kind]}")
        lines.append(f"  {'counter (all switches)':<32} {'hostile':>7} {'increase':>9}  check")
        for row in self.rows:
            lines.append(f"  {row['counter']:<32} {row['hostile']:>7} {row['increase']:>9}  "
                         f"{row['check']}")
        send = self.send
        lines.append(f"  sent {send.get('sent', 0)} frames in {send.get('seconds', 0):.1f} s "
                     f"({send.get('sent', 0) / max(send.get('seconds', 0), 1e-9):.0f}/s), "
                     f"{send.get('during_push', 0)} of them while a push ran")
        lines.append(f"  lost before the pipelines: on the links {self.link_drops}, in the "
                     f"switches' packet sockets {self.socket_drops}")
        ok = sum(1 for p in self.pushes if p["ok"])
        lines.append(f"  pushes during the run: {len(self.pushes)}, correct {ok} "
                     f"(seconds: {', '.join(format(p['seconds'], '.1f') for p in self.pushes)})")
        lines.append("  times: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()))
        lines.append("  CLEAN" if self.clean else "  FAILED:\n    " + "\n    ".join(
            self.failures))
        return "\n".join(lines)


def evaluate(report: Report, frames: list[Hostile], before: dict, after: dict) -> None:
    """Per switch and counter key: the increase against the hostile frames' share."""
    expected: dict[str, Counter[str]] = {name: Counter() for name in before}
    for hostile in frames:
        expected[hostile.switch][hostile.key] += 1
    for key in counter_keys():
        hostile_total = increase_total = 0
        bad = []
        for name in before:
            want = expected[name][key]
            got = key_value(key, *after[name]) - key_value(key, *before[name])
            hostile_total += want
            increase_total += got
            if (got < want) if key in AT_LEAST else (got != want):
                bad.append(f"{name}: {got} for {want} hostile")
        check = (">= " if key in AT_LEAST else "== ") + ("ok" if not bad else "FAIL")
        report.rows.append({"counter": key, "hostile": hostile_total,
                            "increase": increase_total, "check": check})
        report.failures += [f"{key}: {b}" for b in bad]


def run(spec: str, target: str, packets: int, seed: int, workdir: Path, name: str,
        size: int, window: int | None = None, push_window: int | None = None,
        bmv2: str | None = None,
        log: Callable[[str], None] = lambda line: None) -> Report:
    """The whole run on an emulation of its own (``name``), torn down at the end."""
    from control_plane.fabric import Fabric
    from emulation import net

    report = Report(spec, target, packets, seed)
    window = window or WINDOW[target]
    push_window = push_window or PUSH_WINDOW[target]
    report.windows = f"hostile {window}/switch, push {push_window}"
    if target == "bmv2":
        report.switch_binary = net.find_bmv2(bmv2) or ""
    clock = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    with emulation(name, spec, target, bmv2) as state:
        report.seconds["up"] = time.monotonic() - clock
        topology = state.topo()
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_scheduled_job(JOB, IN_NETWORK)
        fabric.add_job(OTHER_JOB, other_job_servers(topology), 0, OTHER_POOL)
        groups = [g for plan in Fabric.load(fabric.path).plans() for g in plan.groups]
        links = topology_links(topology, state.namespace_of)
        grads = gradients(topology.num_servers, size, seed)
        extra = ["--timeout", "120", "--window", str(push_window)]

        clock = time.monotonic()
        first = push(state, grads, workdir, extra, 300)
        problems = judge(first, grads, None)
        if problems:
            report.failures += [f"reference push (no hostile traffic): {p}" for p in problems]
            return report
        reference = [np.load(r.output) for r in first]
        report.seconds["reference push"] = time.monotonic() - clock
        log(f"hostile: {spec} on {target}: reference push in "
            f"{report.seconds['reference push']:.1f} s")

        generations = {}
        for group in groups:
            link, worker = next((link, w) for link in links for w, p in group.members.items()
                                if link.switch == group.switch and link.port == p)
            generations[group.switch, group.job_id] = ask_generation(link, group, worker)
        clock = time.monotonic()
        frames = Generator(links, groups, generations, seed, chunks=-(-size // 64)) \
            .generate(packets)
        report.classes = dict(Counter(h.kind for h in frames).most_common())
        report.seconds["build frames"] = time.monotonic() - clock

        sockets: list[socket.socket] = []
        counters = SwitchCounters(fabric.addresses())
        loop = PushLoop(state, grads, reference, workdir, extra, 300)
        try:
            sockets = [send_socket(link) for link in links]
            drops_before = link_drops(links)
            pids = [info["pid"] for info in state.switches.values()]
            socket_drops_before = namespaces.socket_drops(pids)
            before = counters.read_all()
            loop.start()
            # Into the pushes' data: the switches are adding before the first frame goes.
            aggregated = sum(s[Stat.AGGREGATED] for s, _ in before.values())
            deadline = time.monotonic() + 120
            while (sum(s[Stat.AGGREGATED] for s, _ in counters.read_all().values())
                   < aggregated + 200 and loop.is_alive() and time.monotonic() < deadline):
                time.sleep(0.05)
            log(f"hostile: sending {packets} frames")
            sent = send_all(frames, sockets, counters, window, loop.pushing)
            report.send = sent.__dict__
            report.failures += [f"stalled: {s}" for s in sent.stalled]
            report.seconds["hostile traffic"] = sent.seconds
            loop.stop.set()
            loop.join(timeout=400)
            # Exact counters settle: read until they stop moving.
            after = counters.read_all()
            for _ in range(20):
                time.sleep(0.3)
                again = counters.read_all()
                if again == after:
                    break
                after = again
            evaluate(report, frames, before, after)
            report.link_drops = link_drops(links) - drops_before
            report.socket_drops = namespaces.socket_drops(pids) - socket_drops_before
        finally:
            loop.stop.set()
            for sock in sockets:
                sock.close()
            counters.close()
        report.pushes = [p.__dict__ for p in loop.records]
        if loop.is_alive():
            report.failures.append("the push loop did not end")
        if not loop.records:
            report.failures.append("no push ran during the hostile traffic")
        for record in loop.records:
            report.failures += [f"push at +{record.started - loop.records[0].started:.1f} s: "
                                f"{p}" for p in record.problems]
        dead = [sw for sw, info in state.switches.items() if not net._alive(info["pid"])]
        report.failures += [f"switch {sw} is not running any more" for sw in dead]
        if report.link_drops or report.socket_drops:
            report.failures.append(
                f"{report.link_drops + report.socket_drops} frames (hostile or the pushes') "
                "were lost before the switches' pipelines (the counts cannot be exact)")
        # A last push after the traffic: the job still works.
        if not dead:
            last = judge(push(state, grads, workdir, extra, 300), grads, reference)
            report.failures += [f"push after the hostile traffic: {p}" for p in last]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hostile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packets", type=int, default=10000)
    parser.add_argument("--target", choices=("soft", "bmv2"), default="soft")
    parser.add_argument("--topo", action="append",
                        help="star:4 (default), bcube:2,2; repeat for several")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--size", type=int,
                        help="floats per worker and push (default 262144; bmv2 65536)")
    parser.add_argument("--window", type=int,
                        help="hostile frames per switch in flight, not yet counted (default "
                        f"{WINDOW})")
    parser.add_argument("--push-window", type=int,
                        help=f"the pushes' bml-host push --window (default {PUSH_WINDOW})")
    parser.add_argument("--bmv2", help="simple_switch_grpc to use (default: BMV2_SWITCH, "
                        "PATH, /opt/bmv2/bin)")
    parser.add_argument("--name", default="hos", help="emulation name prefix (default hos)")
    parser.add_argument("--workdir", type=Path, default=Path("results/hostile"))
    parser.add_argument("--json", type=Path, help="write the reports here")
    parser.add_argument("--in-process", action="store_true",
                        help="only check the generator against the software pipeline here")
    args = parser.parse_args(argv)
    specs = args.topo or ["star:4"]
    if args.in_process:
        clean = True
        for spec in specs:
            _frames, differences = check_in_process(spec, args.packets, args.seed)
            print(f"{spec}: {args.packets} frames, {len(differences)} differ")
            print("\n".join(differences[:20]))
            clean = clean and not differences
        return 0 if clean else 1
    from emulation.net import BMV2_MISSING, find_bmv2
    from emulation.testbed import have_netns

    reason = have_netns() or (BMV2_MISSING if args.target == "bmv2"
                              and not find_bmv2(args.bmv2) else None)
    if reason:
        print(f"hostile: {reason}", file=sys.stderr)
        return 2
    reports = []
    for spec in specs:
        tag = args.name + ("s" if spec.startswith("star") else "b")
        started = time.monotonic()
        report = run(spec, args.target, args.packets, args.seed, args.workdir / tag, tag,
                     args.size or (1 << 16 if args.target == "bmv2" else 1 << 18),
                     args.window, args.push_window, args.bmv2,
                     log=lambda line: print(line, flush=True))
        report.seconds["total"] = time.monotonic() - started
        print(report.text(), flush=True)
        reports.append(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in reports], indent=1))
    return 0 if all(r.clean for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
