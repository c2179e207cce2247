"""Synchronisation schedules as data: per stripe, the ordered steps every server runs.

A gradient of L float32 values is cut into B = ceil(L / 64) blocks of 64 (one aggregation
packet each, with one block exponent). On BCube(n, k) the blocks are cut into k stripes; stripe
p visits the dimensions p, p+1, ... (mod k), so at every step each NIC carries one stripe.
A step is (dimension, operation, switch share):

* reduce-scatter (RS) on dimension d: the n servers of a level-d switch each end up owning the
  sum of one n-th of the piece they hold (part i goes to the server whose digit d is i).
  In the switch every server sends the whole piece up and the switch sends each part's sum to
  its owner only (a header-only ACK to the others); host-based each server sends part i to its
  owner over TCP and adds up what the others send it.
* allreduce (AR), in the switch only, on the last dimension: up the piece, down its sum.
* all-gather (AG), back through the RS dimensions: each server's reduced part goes to the n-1
  others. In the switch a NIC sends it once as a BROADCAST; host-based, once per peer.

``switch_share`` is the share of a step's blocks that goes through the switch (1: in-network,
0: host-based, between: the mixed schedule's first reduce-scatter). The executors
(``hosts/engine.py``), the cost model, the planner and the benchmarks all read these
descriptions and the block layout below; ``traffic`` derives from them the frames and bytes
each NIC sends and receives, which is what the cost model prices.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from fractions import Fraction

from bml.protocol import DEFAULT_WIRE, ONE_NIC_WINDOW, Wire
from bml.topology import Topology

IN_NETWORK = "in-network"
HOST_BASED = "host-based"
MIXED = "mixed"
SCHEDULES = (IN_NETWORK, HOST_BASED, MIXED)
AUTO = "auto"  # not a schedule: "the one the cost model predicts fastest"

STRIPE_JOB_STRIDE = 512  # switch job id of stripe p of job J: J + p * STRIPE_JOB_STRIDE
MAX_SCHEDULED_JOB = STRIPE_JOB_STRIDE - 1
MAX_STRIPES = 8  # keeps every stripe's switch job id within the protocol's 12 bits

MESSAGE_BLOCKS = 16  # blocks per host-to-host message (TCP), cut from each range's start
MESSAGE_HEADER_BYTES = 16
EXPONENT_HEADER_BYTES = 16  # the exponent exchange's message header
# The exchange's body per block: one exponent byte, zlib-compressed (``hosts.call``). A
# gradient's block exponents are mostly two or three values: 0.07-0.12 bytes per block on
# normal gradients; a byte per block at worst.
EXPONENT_BYTES_PER_BLOCK = 0.125
# A switch channel in a stripe's first step uses DEFAULT_WINDOW slots of its job's pool (per
# switch and stripe; ``channel_slots``) but keeps at most IN_FLIGHT frames in flight: a slot
# waiting for a re-send or for a co-worker's (lost and re-sent) contribution holds its slot,
# not a place in the link's queue, so under loss the other slots keep the link busy (with no
# more slots than frames in flight, every slot waiting on a loss is a frame the link does not
# carry meanwhile).
DEFAULT_WINDOW = 512
IN_FLIGHT = 256
# How a NIC's share of its link's queue (bml-net's tbf queue: 256 KB) is split between the
# aggregation frames it keeps in flight and the host-to-host streams (TCP) it keeps
# unacknowledged. Alone, either may have the whole queue (TCP keeps 3/4 of it, for bursts:
# bml.sockets.QUEUE_BUDGET); where a NIC carries both (the mixed schedule), together they
# must fit in the queue (a drop is a re-send or a repair), and neither may fill it: every
# answer waits behind the TCP queued before it in the FIFO, so the first step (which streams)
# runs ahead and the later ones lag. Each of the mixed schedule's steps waits for the one
# before, so every byte queued is latency on the path of the call's last blocks: hence
# shares of only a quarter and an eighth of the queue (smaller ones shorten the call no more).
LINK_QUEUE_BYTES = 256_000
SHARED_FRAME_BUDGET = 64_000
SHARED_STREAM_BUDGET = 32_000
STREAM_BUDGET = 192_000  # = bml.sockets.QUEUE_BUDGET (checked in tests)
FRAME_WIRE_BYTES = DEFAULT_WIRE.frame_bytes  # a 64-lane frame: header, values, UDP, IPv4, Ethernet
MIN_CHANNEL_WINDOW = 16

Range = tuple[int, int]  # [start, stop) in blocks


class ScheduleError(ValueError):
    pass


class Op(enum.Enum):
    RS = "reduce-scatter"
    AR = "allreduce"
    AG = "all-gather"


@dataclass(frozen=True)
class Step:
    dim: int
    op: Op
    switch_share: Fraction = Fraction(1)

    @property
    def where(self) -> str:
        if self.switch_share == 1:
            return "switch"
        if self.switch_share == 0:
            return "hosts"
        return f"{self.switch_share} switch"

    def __str__(self) -> str:
        return f"{self.op.name}(d{self.dim}, {self.where})"


Group = tuple[int, int]  # (level, switch index within the level): one switch's servers


@dataclass(frozen=True)
class Schedule:
    """``stripes`` are the steps every server runs; a ``broken`` group (its switch, or a
    member's link to it, failed) runs its own dimension's steps in the hosts instead, over
    detours through the other levels (``Topology.relay``): a step in the hosts leaves every
    server owning the same sums as the switch would, so the other groups run unchanged."""

    name: str
    topology: Topology
    stripes: tuple[tuple[Step, ...], ...]
    alpha: Fraction = Fraction(1)  # the mixed schedule's switch share of its first RS
    broken: frozenset[Group] = frozenset()

    @property
    def code(self) -> str:
        """What workers compare to be sure they run the same schedule."""
        broken = "".join(f":broken{level}.{index}" for level, index in sorted(self.broken))
        return f"{self.name}:{self.alpha}:{self.topology.spec}{broken}"

    def is_broken(self, server: int, dim: int) -> bool:
        return (dim, self.topology.switch_index(server, dim)) in self.broken

    def steps_of(self, stripe: int, server: int | None = None) -> tuple[Step, ...]:
        """The stripe's steps as ``server`` runs them: on a broken dimension in the hosts (an
        allreduce there becomes a reduce-scatter and an all-gather)."""
        steps = self.stripes[stripe]
        if server is None or not self.broken:
            return steps
        out: list[Step] = []
        for step in steps:
            if not self.is_broken(server, step.dim):
                out.append(step)
            elif step.op is Op.AR:
                out += [Step(step.dim, Op.RS, Fraction(0)), Step(step.dim, Op.AG, Fraction(0))]
            else:
                out.append(Step(step.dim, step.op, Fraction(0)))
        return tuple(out)

    def rs_dims(self, stripe: int, server: int | None = None) -> list[int]:
        return [s.dim for s in self.steps_of(stripe, server) if s.op is Op.RS]

    def describe(self) -> list[str]:
        lines = [f"stripe {p}: " + " -> ".join(map(str, steps))
                 for p, steps in enumerate(self.stripes)]
        topo = self.topology
        for level, index in sorted(self.broken):
            switch = topo.switch_at(level, index)
            lines.append(f"switch {switch.name} failed: servers "
                         f"{', '.join(map(str, switch.servers))} run level {level} in the "
                         f"hosts, through relays on level {topo.detour_level(level)}:")
            lines += [f"  stripe {p}: " + " -> ".join(map(str, self.steps_of(p, switch.servers[0])))
                      for p in range(len(self.stripes))]
        return lines

    def degraded(self, broken: set[Group] | frozenset[Group]) -> Schedule:
        """This schedule with the groups ``broken`` also run in the hosts over detours;
        a ScheduleError if some detour would need a broken switch too."""
        broken = frozenset(self.broken | set(broken))
        topo = self.topology
        if topo.k < 2:
            raise ScheduleError(f"{topo.spec} has one switch level: no other path to re-plan "
                                "over")
        for level, index in sorted(broken):
            m = topo.detour_level(level)
            switch = topo.switch_at(level, index)
            for server in switch.servers:
                relay = topo.relay(server, level)
                for needed in ((m, topo.switch_index(server, m)),
                               (level, topo.switch_index(relay, level))):
                    if needed in broken:
                        raise ScheduleError(
                            f"switches {switch.name} and {topo.switch_at(*needed).name} both "
                            "failed: the detour around one needs the other")
        return replace(self, broken=broken)


def balanced_alpha(topology: Topology) -> Fraction:
    """The mixed schedule's switch share of the first RS that makes a NIC's up and down
    payload equal (DESIGN.md: 1/2 on BCube(3,2)), clamped to [0, 1].

    In-network a NIC carries up U = 1 + 2T and down D = 1 + T (units of a stripe, T =
    sum_{j=1}^{k-1} n^-j). Moving a share 1 - a of the first RS to the hosts lowers up by
    (1 - a)/n and raises down by (1 - a)(n - 2)/n; they meet at a = 1 - T n / (n - 1)."""
    n, k = topology.n, topology.k
    tail = sum(Fraction(1, n ** j) for j in range(1, k))
    alpha = 1 - tail * n / (n - 1)
    return min(Fraction(1), max(Fraction(0), alpha))


def make_schedule(topology: Topology, name: str, alpha: Fraction | None = None) -> Schedule:
    """The schedule ``name`` (in-network, host-based, mixed) on ``topology``."""
    k = topology.k
    if k > MAX_STRIPES:
        raise ScheduleError(f"at most {MAX_STRIPES} levels (got k={k})")
    stripes = []
    if name == MIXED:
        if k < 2:
            raise ScheduleError("the mixed schedule needs a BCube with k >= 2 levels; "
                                f"{topology.spec} has one")
        alpha = balanced_alpha(topology) if alpha is None else Fraction(alpha)
        if not 0 <= alpha <= 1:
            raise ScheduleError(f"mixed share must be within [0, 1] (got {alpha})")
    elif name in (IN_NETWORK, HOST_BASED):
        alpha = Fraction(1) if name == IN_NETWORK else Fraction(0)
    else:
        raise ScheduleError(f"unknown schedule {name!r}: one of {', '.join(SCHEDULES)}")
    for p in range(k):
        dims = [(p + j) % k for j in range(k)]
        if name == HOST_BASED:
            steps = [Step(d, Op.RS, Fraction(0)) for d in dims]
            steps += [Step(d, Op.AG, Fraction(0)) for d in reversed(dims)]
        else:
            steps = [Step(d, Op.RS) for d in dims[:-1]] + [Step(dims[-1], Op.AR)]
            steps += [Step(d, Op.AG) for d in reversed(dims[:-1])]
            if name == MIXED:
                steps[0] = Step(dims[0], Op.RS, alpha)
        stripes.append(tuple(steps))
    return Schedule(name, topology, tuple(stripes), alpha)


def stripe_job_id(job: int, stripe: int) -> int:
    """The switch job id that carries stripe ``stripe`` of job ``job``."""
    return job + stripe * STRIPE_JOB_STRIDE


def switch_modes(topology: Topology) -> dict[tuple[int, int], str]:
    """(stripe, level) -> "owner" or "multicast": what each level's switches do for each stripe
    in the in-network and mixed schedules (RS results to the chunk's owner, AR results to all).
    The same entries serve both, and host-based needs none, so job set-up does not depend on
    which schedule the workers run."""
    k = topology.k
    return {(p, level): ("owner" if (level - p) % k < k - 1 else "multicast")
            for p in range(k) for level in range(k)}


# --- block layout -------------------------------------------------------------------------

def split(span: Range, parts: int) -> list[Range]:
    """``span`` cut into ``parts`` contiguous ranges; the first len % parts are one longer."""
    start, stop = span
    size, extra = divmod(stop - start, parts)
    out = []
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def share_split(span: Range, share: Fraction) -> tuple[Range, Range]:
    """(switch part, host part) of a range: the first round(share * len) blocks go through the
    switch."""
    start, stop = span
    cut = start + round(share * (stop - start))
    return (start, cut), (cut, stop)


def length(span: Range) -> int:
    return span[1] - span[0]


@dataclass(frozen=True)
class Layout:
    """Which blocks each server holds, sends and owns at every step of every stripe."""

    schedule: Schedule
    blocks: int

    @property
    def topology(self) -> Topology:
        return self.schedule.topology

    def stripe(self, p: int) -> Range:
        return split((0, self.blocks), self.topology.k)[p]

    def pieces(self, p: int, server: int) -> list[Range]:
        """piece[0] = the stripe; piece[j+1] = the part of piece[j] this server owns after the
        stripe's j-th reduce-scatter."""
        digits = self.topology.digits(server)
        out = [self.stripe(p)]
        for dim in self.schedule.rs_dims(p, server):
            out.append(split(out[-1], self.topology.n)[digits[dim]])
        return out

    def rs_parts(self, p: int, j: int, server: int) -> list[tuple[Range, Range]]:
        """Per owner digit i, the (switch, host) ranges of piece[j] at the stripe's j-th RS."""
        step = self.rs_step(p, j, server)
        piece = self.pieces(p, server)[j]
        return [share_split(part, step.switch_share)
                for part in split(piece, self.topology.n)]

    def rs_step(self, p: int, j: int, server: int | None = None) -> Step:
        return [s for s in self.schedule.steps_of(p, server) if s.op is Op.RS][j]


# --- traffic ------------------------------------------------------------------------------

@dataclass
class Direction:
    frames: int = 0  # full aggregation frames (a block each)
    acks: int = 0  # header-only aggregation frames
    stream_blocks: int = 0  # gradient blocks sent host to host (TCP)
    stream_overhead: int = 0  # message headers and the exponent exchange (TCP)

    def add(self, other: Direction) -> None:
        self.frames += other.frames
        self.acks += other.acks
        self.stream_blocks += other.stream_blocks
        self.stream_overhead += other.stream_overhead

    def payload_blocks(self) -> Fraction:
        """Gradient payload in blocks, headers left out (the DESIGN.md unit)."""
        return Fraction(self.frames + self.stream_blocks)


@dataclass
class NicTraffic:
    up: Direction = field(default_factory=Direction)
    down: Direction = field(default_factory=Direction)


def _messages(span_blocks: int) -> int:
    return -(-span_blocks // MESSAGE_BLOCKS)


def _send(direction: Direction, span_blocks: int, times: int = 1) -> None:
    """Count one range sent host to host as messages, ``times`` over."""
    direction.stream_blocks += times * span_blocks
    direction.stream_overhead += times * _messages(span_blocks) * MESSAGE_HEADER_BYTES


def _odd_slots(blocks: int, slots: int) -> int:
    uses, extra = divmod(blocks, slots)
    return (extra if (uses + 1) & 1 else 0) + (slots - extra if uses & 1 else 0)


def channel_window(blocks: int, window: int) -> int:
    """The slots a switch channel of ``blocks`` blocks uses: at most ``window``, at least half
    of it (or half the blocks), chosen so that the fewest slots end on an odd number of uses
    (each such slot costs a zero 'flush' use, so that the next call starts on copy 0).
    Every member computes the same."""
    if blocks <= 0:
        return 1
    if blocks <= 2 * window:
        return max(1, -(-blocks // 2))
    return min(range(window, window // 2 - 1, -1), key=lambda w: _odd_slots(blocks, w))


def _nic_use(schedule: Schedule, server: int) -> list[tuple[int, bool]]:
    """Per NIC of ``server``: (its switch channels, whether it also streams host to host)."""
    channels = [0] * schedule.topology.k
    streams = [False] * schedule.topology.k
    for p in range(len(schedule.stripes)):
        for step in schedule.steps_of(p, server):
            if step.op is not Op.AG and step.switch_share > 0:
                channels[step.dim] += 1
            if step.switch_share < 1:
                streams[step.dim] = True
    return list(zip(channels, streams, strict=True))


def nic_in_flight(schedule: Schedule, server: int, limit: int = IN_FLIGHT,
                  frame_bytes: int = FRAME_WIRE_BYTES) -> list[int]:
    """Per NIC of ``server``, the frames (of ``frame_bytes``) each of its switch channels
    keeps in flight at most: ``limit``, or less so that the NIC's channels keep at most their
    share of the link's queue in flight together (SHARED_FRAME_BUDGET beside streams, else
    LINK_QUEUE_BYTES)."""
    return [min(limit, max(MIN_CHANNEL_WINDOW, (SHARED_FRAME_BUDGET if streaming
                                                else LINK_QUEUE_BYTES) // (frame_bytes * c)))
            if c else limit for c, streaming in _nic_use(schedule, server)]


def one_nic_window(wire: Wire = DEFAULT_WIRE) -> int:
    """The one-NIC transport's default slots (all in flight): ONE_NIC_WINDOW, or fewer
    wide frames, so that they fit the link's queue (as ``nic_in_flight`` bounds a channel)."""
    return min(ONE_NIC_WINDOW, max(MIN_CHANNEL_WINDOW, LINK_QUEUE_BYTES // wire.frame_bytes))


def channel_slots(window: int, in_flight: int, first_step: bool) -> int:
    """The slots (before ``channel_window``) a switch channel uses: all of ``window`` in a
    stripe's first step, where every member sends the blocks in the same order, so answers
    come back in the order the frames left and a frame answered says every frame sent before
    it has left the link's queue; more slots than frames in flight then keep the link busy
    while some wait for re-sends. In a later step the blocks become ready in a different
    order on each member, answers come back out of order (an answer no longer says what has
    left the queue), and the slots themselves must bound what is in the queue: no more than
    ``in_flight``, or the queue, and every answer's wait in it, grows with the window."""
    return window if first_step else min(window, in_flight)


def mesh_is_control_only(schedule: Schedule, server: int) -> bool:
    """Whether ``server``'s TCP mesh carries only a call's control messages, the exponent
    exchange at its start and DONE at its end, when the links are idle: every step of it an
    allreduce in the switch (a star's in-network schedule). Nothing else waits in queues."""
    return all(step.op is Op.AR and step.switch_share == 1
               for p in range(len(schedule.stripes)) for step in schedule.steps_of(p, server))


def stream_budgets(schedule: Schedule, server: int) -> list[int]:
    """Per NIC of ``server``, the bytes its host-to-host streams keep unacknowledged in all
    (split among the level's n - 1 neighbours by the mesh)."""
    return [SHARED_STREAM_BUDGET if channels else STREAM_BUDGET
            for channels, _streaming in _nic_use(schedule, server)]


def connection_limit(budget: int, n: int) -> int:
    """Bytes one mesh connection keeps unacknowledged: its NIC's ``budget``
    (``stream_budgets``) split among the level's n - 1 neighbours, who all send to the NIC
    at once (at least one whole segment)."""
    return max(9000, budget // max(1, n - 1))


def flushes(channel_blocks: int, window: int) -> int:
    """Zero 'flush' uses a switch channel of ``channel_blocks`` adds (see channel_window)."""
    if channel_blocks <= 0:
        return 0
    return _odd_slots(channel_blocks, channel_window(channel_blocks, window))


def traffic(layout: Layout, server: int, window: int | None = DEFAULT_WINDOW,
            exponents: bool = True) -> list[NicTraffic]:
    """What each NIC of ``server`` sends (up) and receives (down) to run the schedule, as the
    executors do it. ``window=None`` leaves the flush uses out, ``exponents=False`` the
    exponent exchange: both are overheads of this implementation, not of the schedule.

    A broken group's level goes over detours: its members' level-l traffic leaves and
    arrives on their detour NIC m, and each relay carries its client's both ways, on its
    NIC m and its NIC l."""
    nics = _traffic_of(layout, server, window, exponents)
    schedule, topo = layout.schedule, layout.topology
    for level in range(topo.k if schedule.broken else 0):
        m = topo.detour_level(level)
        if schedule.is_broken(server, level):
            nics[m].up.add(nics[level].up)
            nics[m].down.add(nics[level].down)
            nics[level] = NicTraffic()
        digits = list(topo.digits(server))
        digits[m] = (digits[m] - 1) % topo.n
        client = topo.server_of(tuple(digits))
        if schedule.is_broken(client, level):
            relayed = _traffic_of(layout, client, window, exponents)[level]
            nics[m].down.add(relayed.up)
            nics[level].up.add(relayed.up)
            nics[level].down.add(relayed.down)
            nics[m].up.add(relayed.down)
    return nics


def _traffic_of(layout: Layout, server: int, window: int | None,
                exponents: bool) -> list[NicTraffic]:
    """``traffic`` by the level each step is on, detours left out."""
    topo, schedule = layout.topology, layout.schedule
    n = topo.n
    nics = [NicTraffic() for _ in range(topo.k)]
    limits = nic_in_flight(schedule, server)
    me = topo.digits(server)
    for p in range(len(schedule.stripes)):
        pieces = layout.pieces(p, server)
        rs_index = {dim: j for j, dim in enumerate(schedule.rs_dims(p, server))}
        for step in schedule.steps_of(p, server):
            nic = nics[step.dim]
            mine = me[step.dim]
            if step.op is Op.RS:
                j = rs_index[step.dim]
                parts = layout.rs_parts(p, j, server)
                switch_blocks = sum(length(sw) for sw, _ in parts)
                nic.up.frames += switch_blocks
                nic.down.frames += length(parts[mine][0])
                nic.down.acks += switch_blocks - length(parts[mine][0])
                for i, (_, host) in enumerate(parts):
                    if i != mine:
                        _send(nic.up, length(host))
                _send(nic.down, length(parts[mine][1]), n - 1)
                if window and switch_blocks:
                    extra = flushes(switch_blocks,
                                    channel_slots(window, limits[step.dim], j == 0))
                    nic.up.frames += extra
                    if mine == 0:  # a flush's "owner" is worker 0
                        nic.down.frames += extra
                    else:
                        nic.down.acks += extra
            elif step.op is Op.AR:
                blocks = length(pieces[-1])
                nic.up.frames += blocks
                nic.down.frames += blocks
                if window and blocks:
                    extra = flushes(blocks, channel_slots(window, limits[step.dim],
                                                          not rs_index))
                    nic.up.frames += extra
                    nic.down.frames += extra
            else:  # AG: gather piece[j] from every server's piece[j + 1]
                j = rs_index[step.dim]
                own, whole = pieces[j + 1], pieces[j]
                if step.switch_share:
                    nic.up.frames += length(own)
                    nic.down.frames += length(whole) - length(own)
                else:
                    others = [r for i, r in enumerate(split(whole, n)) if i != mine]
                    _send(nic.up, length(own), n - 1)
                    for r in others:
                        _send(nic.down, length(r))
    if exponents:
        for nic in nics:  # one exchange per dimension, with every neighbour on it
            message = math.ceil(layout.blocks * EXPONENT_BYTES_PER_BLOCK) + EXPONENT_HEADER_BYTES
            nic.up.stream_overhead += (n - 1) * message
            nic.down.stream_overhead += (n - 1) * message
    return nics


def ideal_cost(schedule: Schedule) -> tuple[Fraction, Fraction]:
    """(up, down) payload of the busiest NIC in units of a stripe S = G / k, without headers,
    flushes or exponents: the figures DESIGN.md derives by hand. Computed from ``traffic`` on
    a block count every split divides exactly."""
    topo = schedule.topology
    blocks = topo.k * topo.n ** (topo.k + 1) * schedule.alpha.denominator
    layout = Layout(schedule, blocks)
    stripe = Fraction(blocks, topo.k)
    up = down = Fraction(0)
    for server in range(topo.num_servers):
        for nic in traffic(layout, server, window=None, exponents=False):
            up = max(up, nic.up.payload_blocks() / stripe)
            down = max(down, nic.down.payload_blocks() / stripe)
    return up, down
