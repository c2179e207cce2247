"""The simulator's network: real frames through the real pipeline, links in virtual time."""

from __future__ import annotations

import itertools
import random

import pytest

from bml.protocol import (
    DEFAULT_WIRE,
    EXPONENT_BIAS,
    HEADER_BYTES,
    DropReason,
    PacketType,
    Stat,
    job_udp_port,
    pack_header,
    unpack_header,
)
from bml.schedule import stripe_job_id
from bml.topology import Topology
from control_plane.jobs import plan_job, plan_scheduled_job
from control_plane.provision import install_group, provision_switch
from control_plane.session import SwitchSession, SwitchUnreachable
from simulation.network import (
    SEGMENT_HEADERS,
    SEGMENT_PAYLOAD,
    WIRE_OVERHEAD,
    Clock,
    LinkShape,
    Network,
)
from soft_target.p4runtime_server import serve
from soft_target.pipeline import Pipeline
from tests.conftest import in_process_servicer

BCUBE = Topology.parse("bcube:2,2")
JOB = 3


class Hosts:
    """Every datagram the network delivers, as (time, server, level, header, values)."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.got: list[tuple[float, int, int, tuple, tuple]] = []

    def deliver(self, server: int, level: int, payload: bytes) -> None:
        values = DEFAULT_WIRE.values_struct.unpack_from(payload, HEADER_BYTES) \
            if len(payload) > HEADER_BYTES else ()
        self.got.append((self.clock.now, server, level, unpack_header(payload), values))


def network(shape: LinkShape | None = None, seed: int = 1, topology: Topology = BCUBE
            ) -> tuple[Network, Hosts]:
    hosts = Hosts()
    net = Network(hosts.clock, topology, shape or LinkShape(), random.Random(seed),
                  hosts.deliver)
    for switch in topology.switches:
        net.provision(switch.name)
    return net, hosts


def data(job: int, worker: int, values, slot: int = 0, owner: int = 0, exponent: int = 3,
         offset: int = 0) -> bytes:
    return pack_header(PacketType.DATA, job, worker, slot, owner_id=owner,
                       exponent=EXPONENT_BIAS + exponent, count=DEFAULT_WIRE.blocks,
                       offset=offset, generation=1) + DEFAULT_WIRE.values_struct.pack(*values)


def one_worker_job(net: Network, server: int = 0, slots: int = 512) -> int:
    """A job of ``server`` alone on its level-0 switch: every DATA completes at once."""
    plan = plan_job(net.topology, 7, [server], level=0, pool_size=slots)
    net.install_job(plan)
    return 7


# ---------------------------------------------------------------------------- clock
def test_clock_runs_in_time_then_schedule_order_and_cancels():
    clock, ran = Clock(), []
    clock.at(2.0, ran.append, "b")
    clock.at(1.0, ran.append, "a")
    clock.at(2.0, ran.append, "c")
    clock.after(1.5, ran.append, "cancelled").cancel()
    assert clock.pending() == 3
    clock.run_until(1.0)
    assert ran == ["a"] and clock.now == 1.0
    clock.run_until(10.0, stop=lambda: len(ran) == 2)
    assert ran == ["a", "b"] and clock.now == 2.0  # stopped after the event that made it true
    clock.run_until(10.0)
    assert ran == ["a", "b", "c"] and clock.now == 10.0 and clock.pending() == 0
    clock.at(3.0, ran.append, "late")  # in the past: runs now
    clock.run_until(10.0)
    assert ran[-1] == "late"


# ---------------------------------------------------------------------------- aggregation
def test_a_scheduled_job_aggregates_through_the_real_pipeline():
    net, hosts = network()
    net.install_job(plan_scheduled_job(BCUBE, JOB, "in-network"))
    switch = BCUBE.switch_at(0, 0)
    rng = random.Random(5)
    for stripe in range(BCUBE.k):  # level 0 reduce-scatters stripe 0, allreduces stripe 1
        job = stripe_job_id(JOB, stripe)
        vectors = {}
        for server in switch.servers:
            worker = BCUBE.digits(server)[0]
            vectors[server] = [rng.randint(-(1 << 28), 1 << 28) for _ in range(64)]
            net.send_frame(server, 0, job_udp_port(job),
                           data(job, worker, vectors[server], owner=1, exponent=worker))
        hosts.got.clear()
        hosts.clock.run_until(hosts.clock.now + 0.01)
        total = tuple(sum(column) for column in zip(*vectors.values(), strict=True))
        answers = {server: (header, values) for _, server, _, header, values in hosts.got}
        assert sorted(answers) == list(switch.servers)
        for server, (header, values) in answers.items():
            owner = BCUBE.digits(server)[0] == 1
            if stripe == 0 and not owner:
                assert header[0] == PacketType.ACK and values == ()
            else:
                assert header[0] == PacketType.RESULT and values == total
                assert header[6] == EXPONENT_BIAS + 1  # the larger exponent
            assert header[2] == job
    assert net.pipeline(switch.name).stats[Stat.COMPLETED] == 2


def test_tables_and_resets_match_the_soft_targets_p4runtime_server():
    """The same control-plane calls over P4Runtime to the software target leave the same
    tables, registers and counters as the simulator's provisioning."""
    net, _ = network()
    plan = plan_scheduled_job(BCUBE, JOB, "in-network")
    net.install_job(plan)
    switch = BCUBE.switch_at(1, 1)
    reference = Pipeline()
    server, port = serve(in_process_servicer(reference), "127.0.0.1:0")
    session = SwitchSession("soft", f"127.0.0.1:{port}", 1, (0, 1), timeout=3)
    try:
        provision_switch(session, BCUBE, switch)
        for group in plan.groups:
            if group.switch == switch.name:
                install_group(session, switch, group)
    finally:
        session.close()
        server.stop(0)
    simulated = net.pipeline(switch.name)
    assert simulated.tables == reference.tables
    assert simulated.stats == reference.stats and simulated.drops == reference.drops
    assert simulated.worker_bitmap == reference.worker_bitmap


# ---------------------------------------------------------------------------- links
def test_frames_arrive_at_the_links_rate():
    shape = LinkShape(rate=10e6, delay=1e-3)
    net, hosts = network(shape)
    job = one_worker_job(net)
    for slot in range(100):
        net.send_frame(0, 0, job_udp_port(job), data(job, 0, [slot] * 64, slot=slot))
    hosts.clock.run_until(5.0)
    frame_time = (314 + WIRE_OVERHEAD) * 8 / shape.rate
    times = [t for t, *_ in hosts.got]
    assert len(times) == 100
    # up: the last contribution is in after 100 frame times; its result needs one more down
    assert times[-1] == pytest.approx(101 * frame_time + 2 * shape.delay)
    assert all(b - a == pytest.approx(frame_time) for a, b in itertools.pairwise(times))
    assert net.bytes_per_nic()[(0, 0)] == (100 * 314, 100 * 314)


def test_a_full_queue_tail_drops_and_counts():
    net, hosts = network(LinkShape(rate=10e6, queue=3000))
    job = one_worker_job(net)
    for slot in range(100):
        net.send_frame(0, 0, job_udp_port(job), data(job, 0, [1] * 64, slot=slot))
    hosts.clock.run_until(1.0)
    up = net.counters[(0, 0, "up")]
    assert up.dropped == 100 - up.frames == 100 - len(hosts.got)
    assert up.frames * (314 + WIRE_OVERHEAD) >= 3000 > (up.frames - 1) * (314 + WIRE_OVERHEAD)


def test_loss_is_near_its_rate_and_reordering_lets_later_frames_overtake():
    net, hosts = network(LinkShape(loss=0.1, queue=1 << 30), seed=11)
    job = one_worker_job(net, slots=2000)
    for slot in range(2000):
        net.send_frame(0, 0, job_udp_port(job), data(job, 0, [1] * 64, slot=slot))
    hosts.clock.run_until(1.0)
    up, down = net.counters[(0, 0, "up")], net.counters[(0, 0, "down")]
    assert 160 <= up.lost <= 240 and up.frames == 2000
    assert down.frames == 2000 - up.lost and len(hosts.got) == down.frames - down.lost

    net, hosts = network(LinkShape(reorder=0.2, reorder_delay=1e-4), seed=12)
    job = one_worker_job(net)
    for slot in range(200):
        net.send_frame(0, 0, job_udp_port(job), data(job, 0, [1] * 64, slot=slot))
    hosts.clock.run_until(1.0)
    slots = [header[5] for _, _, _, header, _ in hosts.got]
    assert sorted(slots) == list(range(200)) and slots != sorted(slots)


def test_a_killed_switch_drops_and_comes_back_empty_until_installed_again():
    net, hosts = network()
    plan = plan_job(BCUBE, 7, [0], level=0)
    net.install_job(plan)
    name = plan.groups[0].switch
    send = lambda slot: net.send_frame(0, 0, job_udp_port(7), data(7, 0, [1] * 64, slot))  # noqa: E731
    net.kill_switch(name)
    assert net.pipeline(name) is None
    send(0)
    hosts.clock.run_until(1.0)
    assert hosts.got == [] and net.counters[(0, 0, "up")].dead == 1
    with pytest.raises(SwitchUnreachable):
        net.install_group(plan.groups[0])
    net.restore_switch(name)
    fresh = net.pipeline(name)
    assert fresh is not None and fresh.tables.job_config == {}
    send(1)
    hosts.clock.run_until(2.0)
    assert hosts.got == [] and fresh.drops[DropReason.UNKNOWN_JOB] == 1
    net.provision(name)
    net.install_group(plan.groups[0])
    send(2)
    hosts.clock.run_until(3.0)
    assert [header[0] for _, _, _, header, _ in hosts.got] == [PacketType.RESULT]


def test_frames_with_garbled_addresses_are_refused_and_never_change_a_sum():
    net, hosts = network()
    job = one_worker_job(net)
    net.corrupt_next(0, 0, 200)
    for slot in range(200):
        net.send_frame(0, 0, job_udp_port(job), data(job, 0, [1] * 64, slot=slot))
    hosts.clock.run_until(1.0)
    pipeline = net.pipeline(BCUBE.nics(0)[0].switch)
    refused = sum(pipeline.drops) + net.counters[(0, 0, "down")].rejected
    assert refused > 0 and len(hosts.got) < 200
    assert all(values == (1,) * 64 for *_, values in hosts.got)  # the headers only are garbled


# ---------------------------------------------------------------------------- streams
def test_streams_arrive_in_order_and_count_their_segments():
    net, hosts = network(LinkShape(rate=1e8))
    hops = net.route(0, 1, 0, detour=False)
    assert hops == [(0, 0), (1, 0)]
    arrived: list[tuple[int, float]] = []
    sizes = [100_000, 16, 30_000, 1_000_000, 9]
    for index, size in enumerate(sizes):
        net.send_stream(hops, size, lambda i=index: arrived.append((i, hosts.clock.now)))
    assert net.unacked(hops) == sum(sizes)
    hosts.clock.run_until(5.0)
    assert [i for i, _ in arrived] == list(range(len(sizes))) and net.unacked(hops) == 0
    segments = sum(-(-size // SEGMENT_PAYLOAD) for size in sizes)
    wire = sum(sizes) + segments * SEGMENT_HEADERS
    assert net.bytes_per_nic()[(0, 0)] == (wire, 0) and net.bytes_per_nic()[(1, 0)] == (0, wire)
    pace = (wire + segments * WIRE_OVERHEAD) * 8 / 1e8
    assert pace < arrived[-1][1] < pace * 1.05

    net, hosts = network(LinkShape(loss=0.05), seed=3)
    arrived.clear()
    for index in range(30):
        net.send_stream(hops, 20_000, lambda i=index: arrived.append((i, hosts.clock.now)))
    hosts.clock.run_until(30.0)
    assert [i for i, _ in arrived] == list(range(30))
    assert net.counters[(0, 0, "up")].lost + net.counters[(1, 0, "down")].lost > 0


class FirstDrawLoses(random.Random):
    """Loses the first frame or segment the network draws loss for, and nothing after it."""

    def __init__(self) -> None:
        super().__init__(0)
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return 0.0 if self.draws == 1 else 0.99


@pytest.mark.parametrize("behind", [True, False])
def test_a_lost_segment_is_resent_as_rack_does_or_after_the_rto_when_alone(behind):
    """A lost segment with one sent behind it is re-sent once that one's SACK is back (Linux's
    RACK: the HERE behind every EXPONENTS and DONE is there for this); alone, it waits for
    the retransmission timeout."""
    hosts = Hosts()
    net = Network(hosts.clock, BCUBE, LinkShape(rate=1e8, loss=0.01), FirstDrawLoses(),
                  hosts.deliver)
    for switch in BCUBE.switches:
        net.provision(switch.name)
    hops = net.route(0, 1, 0, detour=False)
    arrived: list[tuple[str, float]] = []
    net.send_stream(hops, 100, lambda: arrived.append(("lost", hosts.clock.now)), 0.02)
    if behind:
        net.send_stream(hops, 16, lambda: arrived.append(("behind", hosts.clock.now)), 0.02)
    hosts.clock.run_until(1.0)
    assert net.counters[(0, 0, "up")].lost == 1
    assert [name for name, _ in arrived] == (["lost", "behind"] if behind else ["lost"])
    if behind:
        assert arrived[0][1] < 0.001  # two transits and the SACK's way back: microseconds
    else:
        assert 0.02 < arrived[0][1] < 0.021


def test_a_stream_waits_for_a_down_link_and_detours_around_a_dead_switch():
    net, hosts = network()
    hops = net.route(0, 1, 0, detour=False)
    arrived: list[float] = []
    net.set_link(1, 0, up=False)
    net.send_stream(hops, 50_000, lambda: arrived.append(hosts.clock.now))
    hosts.clock.run_until(5.0)
    assert arrived == [] and net.counters[(1, 0, "down")].down > 0
    net.set_link(1, 0, up=True)
    hosts.clock.run_until(10.0)
    assert len(arrived) == 1 and 5.0 < arrived[0] <= 5.0 + 3.3

    switch = BCUBE.nics(0)[0].switch
    net.kill_switch(switch)
    detour = net.route(0, 1, 0, detour=True)
    relay_0, relay_1 = BCUBE.relay(0, 0), BCUBE.relay(1, 0)
    assert detour == [(0, 1), (relay_0, 1), (relay_0, 0), (relay_1, 0), (relay_1, 1), (1, 1)]
    net.send_stream(detour, 50_000, lambda: arrived.append(hosts.clock.now))
    net.send_stream(hops, 10_000, lambda: arrived.append(-1.0))
    hosts.clock.run_until(20.0)
    assert len(arrived) == 2 and arrived[1] < 10.1  # the direct one waits for the switch
    net.restore_switch(switch)
    hosts.clock.run_until(30.0)
    assert len(arrived) == 2  # alive but not provisioned: no l2 entries yet
    net.provision(switch)
    hosts.clock.run_until(40.0)
    assert arrived[-1] == -1.0


# ---------------------------------------------------------------------------- determinism
def run(seed: int) -> int:
    net, hosts = network(LinkShape(rate=1e8, loss=0.05, reorder=0.05, queue=20_000), seed)
    net.install_job(plan_scheduled_job(BCUBE, JOB, "in-network"))
    for switch in BCUBE.switches:
        job = stripe_job_id(JOB, switch.level)
        for server in switch.servers:
            worker = BCUBE.digits(server)[switch.level]
            for slot in range(64):
                net.send_frame(server, switch.level, job_udp_port(job),
                               data(job, worker, [slot] * 64, slot=slot, owner=slot % 2))
    net.corrupt_next(2, 1, 5)
    net.send_stream(net.route(0, 2, 1, detour=False), 200_000, lambda: None)
    hosts.clock.at(0.001, net.kill_switch, "s0_1")
    hosts.clock.run_until(2.0)
    return net.trace_hash()


def test_the_same_seed_replays_the_same_trace():
    assert run(1) == run(1)
    assert run(1) != run(2)
