"""Schedules as data: the byte counts each NIC carries, against figures derived by hand, and
the block layout every executor relies on."""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise

import pytest

from bml import cost_model
from bml.protocol import DEFAULT_WIRE, ResultMode, wire
from bml.schedule import (
    DEFAULT_WINDOW,
    FRAME_WIRE_BYTES,
    HOST_BASED,
    IN_FLIGHT,
    IN_NETWORK,
    LINK_QUEUE_BYTES,
    MIXED,
    SHARED_FRAME_BUDGET,
    SHARED_STREAM_BUDGET,
    STREAM_BUDGET,
    Layout,
    Op,
    ScheduleError,
    balanced_alpha,
    channel_window,
    flushes,
    ideal_cost,
    make_schedule,
    mesh_is_control_only,
    nic_in_flight,
    split,
    stream_budgets,
    stripe_job_id,
    traffic,
)
from bml.sockets import QUEUE_BUDGET
from bml.topology import Topology
from control_plane.jobs import JobError, plan_scheduled_job

# (topology, schedule) -> (up, down) of the busiest NIC in units of a stripe S = G / k,
# payload only. Derived by hand (DESIGN.md, "BCube and the synchronisation schedules"):
# in-network up 1 + 2 sum_{j=1}^{k-1} n^-j, down sum_{j=0}^{k-1} n^-j; host-based
# 2 (1 - 1/N) each way; mixed a = 1 - T n/(n-1) (T = sum_{j>=1} n^-j) balances the two.
HAND_DERIVED = {
    ("star:4", IN_NETWORK): (Fraction(1), Fraction(1)),
    ("star:4", HOST_BASED): (Fraction(3, 2), Fraction(3, 2)),
    ("star:9", IN_NETWORK): (Fraction(1), Fraction(1)),
    ("star:9", HOST_BASED): (Fraction(16, 9), Fraction(16, 9)),
    ("bcube:2,2", IN_NETWORK): (Fraction(2), Fraction(3, 2)),
    ("bcube:2,2", HOST_BASED): (Fraction(3, 2), Fraction(3, 2)),
    ("bcube:2,2", MIXED): (Fraction(3, 2), Fraction(3, 2)),  # a = 0: the first RS all host-based
    ("bcube:3,2", IN_NETWORK): (Fraction(5, 3), Fraction(4, 3)),
    ("bcube:3,2", HOST_BASED): (Fraction(16, 9), Fraction(16, 9)),
    ("bcube:3,2", MIXED): (Fraction(3, 2), Fraction(3, 2)),
    ("bcube:4,2", IN_NETWORK): (Fraction(3, 2), Fraction(5, 4)),
    ("bcube:4,2", HOST_BASED): (Fraction(15, 8), Fraction(15, 8)),
    ("bcube:4,2", MIXED): (Fraction(17, 12), Fraction(17, 12)),
    ("bcube:2,3", IN_NETWORK): (Fraction(5, 2), Fraction(7, 4)),
    ("bcube:2,3", HOST_BASED): (Fraction(7, 4), Fraction(7, 4)),
    ("bcube:3,3", IN_NETWORK): (Fraction(17, 9), Fraction(13, 9)),
    ("bcube:3,3", HOST_BASED): (Fraction(52, 27), Fraction(52, 27)),
    ("bcube:3,3", MIXED): (Fraction(5, 3), Fraction(5, 3)),
}


@pytest.mark.parametrize(("spec", "name"), sorted(HAND_DERIVED))
def test_busiest_nic_payload_matches_the_hand_derived_figure(spec, name):
    schedule = make_schedule(Topology.parse(spec), name)
    assert ideal_cost(schedule) == HAND_DERIVED[(spec, name)]


def test_design_figures_per_gradient_on_bcube32_and_star9():
    """DESIGN.md: per NIC, in units of G, host-based BML 0.89, in-network 0.83, mixed 0.75;
    one switch for the star 1.0 (PS and ring: 2 (N-1)/N = 1.78)."""
    bcube = Topology.parse("bcube:3,2")
    per_g = {name: max(ideal_cost(make_schedule(bcube, name))) / bcube.k
             for name in (HOST_BASED, IN_NETWORK, MIXED)}
    assert per_g == {HOST_BASED: Fraction(8, 9), IN_NETWORK: Fraction(5, 6), MIXED: Fraction(3, 4)}
    star = Topology.parse("star:9")
    assert max(ideal_cost(make_schedule(star, IN_NETWORK))) == 1
    assert max(ideal_cost(make_schedule(star, HOST_BASED))) == 2 * Fraction(8, 9)


def test_balanced_alpha():
    assert balanced_alpha(Topology.parse("bcube:3,2")) == Fraction(1, 2)
    assert balanced_alpha(Topology.parse("bcube:2,2")) == 0
    assert balanced_alpha(Topology.parse("bcube:3,3")) == Fraction(1, 3)


def test_stripes_visit_every_dimension_once_each_step_one_stripe_per_nic():
    topo = Topology.parse("bcube:3,3")
    for name in (IN_NETWORK, HOST_BASED, MIXED):
        schedule = make_schedule(topo, name)
        for p, steps in enumerate(schedule.stripes):
            assert steps[0].dim == p
            assert sorted({s.dim for s in steps}) == [0, 1, 2]
        for position in range(len(schedule.stripes[0])):
            assert sorted(steps[position].dim for steps in schedule.stripes) == [0, 1, 2]
    in_network = make_schedule(topo, IN_NETWORK).stripes[1]
    assert [s.op for s in in_network] == [Op.RS, Op.RS, Op.AR, Op.AG, Op.AG]
    assert [s.dim for s in in_network] == [1, 2, 0, 2, 1]


def test_unknown_or_impossible_schedules_are_refused():
    with pytest.raises(ScheduleError, match="unknown schedule"):
        make_schedule(Topology.parse("bcube:2,2"), "ring")
    with pytest.raises(ScheduleError, match="needs a BCube with k >= 2"):
        make_schedule(Topology.parse("star:4"), MIXED)


def test_split_covers_the_range_in_order_sizes_differ_by_one_at_most():
    for size in range(0, 40):
        for parts in (1, 2, 3, 7):
            ranges = split((5, 5 + size), parts)
            assert ranges[0][0] == 5 and ranges[-1][1] == 5 + size
            assert all(a[1] == b[0] for a, b in pairwise(ranges))
            lengths = [b - a for a, b in ranges]
            assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("spec", ["bcube:2,2", "bcube:3,2", "bcube:2,3", "star:5"])
@pytest.mark.parametrize("blocks", [1, 7, 157, 1000])
def test_after_the_reduce_scatters_every_block_has_exactly_one_owner_per_group(spec, blocks):
    """Host-based: after the k RS steps each block is owned by exactly one server; in-network
    the k-1 RS steps leave each block with one server in every last-dimension group."""
    topo = Topology.parse(spec)
    for name in (HOST_BASED, IN_NETWORK):
        layout = Layout(make_schedule(topo, name), blocks)
        for p in range(topo.k):
            owners: dict[int, list[int]] = {}
            for server in range(topo.num_servers):
                start, stop = layout.pieces(p, server)[-1]
                for block in range(start, stop):
                    owners.setdefault(block, []).append(server)
            stripe = layout.stripe(p)
            assert sorted(owners) == list(range(*stripe))
            expected = 1 if name == HOST_BASED else topo.n
            if name == IN_NETWORK and topo.k == 1:
                expected = topo.num_servers  # the star's AR: everybody holds every block
            assert all(len(s) == expected for s in owners.values())


@pytest.mark.parametrize("spec", ["bcube:2,2", "bcube:3,2", "bcube:2,3"])
@pytest.mark.parametrize("name", [IN_NETWORK, HOST_BASED, MIXED])
def test_what_hosts_send_each_other_is_what_they_receive(spec, name):
    """Host-to-host bytes are conserved, and every broadcast frame up arrives at the n-1
    others, for a block count that divides nothing evenly."""
    topo = Topology.parse(spec)
    layout = Layout(make_schedule(topo, name), 1009)
    nics = [traffic(layout, server) for server in range(topo.num_servers)]
    for level in range(topo.k):
        up = sum(nic[level].up.stream_blocks for nic in nics)
        down = sum(nic[level].down.stream_blocks for nic in nics)
        assert up == down
        up = sum(nic[level].up.stream_overhead for nic in nics)
        down = sum(nic[level].down.stream_overhead for nic in nics)
        assert up == down


def test_channel_window_keeps_flushes_few():
    """Every slot must end on an even number of uses; the window is chosen so that few need
    a zero flush use: none or one up to two windows of blocks, and at most a few percent
    beyond (the worst case, a window of 1, is never chosen)."""
    assert flushes(0, 256) == 0
    assert flushes(1, 256) == 1
    assert flushes(256, 256) == 0  # 128 slots used twice
    assert flushes(257, 256) == 1
    for blocks in range(513, 20000, 97):
        window = channel_window(blocks, 256)
        assert 128 <= window <= 256
        assert flushes(blocks, 256) <= max(2, 0.07 * blocks), blocks


def test_exact_traffic_of_a_star_in_network():
    """star:4, 100 blocks, window 64: 50 slots used twice, no flush."""
    layout = Layout(make_schedule(Topology.parse("star:4"), IN_NETWORK), 100)
    nic = traffic(layout, 2, window=64, exponents=False)[0]
    assert (nic.up.frames, nic.down.frames, nic.up.acks, nic.down.acks) == (100, 100, 0, 0)
    layout = Layout(make_schedule(Topology.parse("star:4"), IN_NETWORK), 301)
    nic = traffic(layout, 2, window=64, exponents=False)[0]
    assert nic.up.frames == 301 + flushes(301, 64)


def test_wire_prediction_prices_every_header():
    """In-network on the star: one 314-byte frame per 64 values each way, plus flushes and
    the exponent exchange over TCP (an eighth of a byte per block, compressed)."""
    star = Topology.parse("star:4")
    elements = 256 * DEFAULT_WIRE.lanes
    prediction = cost_model.predict(make_schedule(star, IN_NETWORK), elements, 1e6)
    frames = 256 * 314
    exponents = 3 * (256 // 8 + 16)
    assert frames + exponents < prediction.max_up < frames + 1.1 * exponents + 200
    assert prediction.gst == pytest.approx(prediction.busiest * 8 / 1e6)
    assert FRAME_WIRE_BYTES == 314 == DEFAULT_WIRE.payload_bytes + 8 + 20 + 14


def test_wide_packets_carry_more_of_the_gradient_per_wire_byte():
    """At 2,208 lanes the same gradient takes 1/34.5 of the frames, and the in-network
    star's bytes per NIC fall from 314/256 to 8890/8832 of the payload (plus exponents)."""
    star = Topology.parse("star:4")
    wide = wire(2208)
    elements = 64 * wide.lanes
    narrow_p = cost_model.predict(make_schedule(star, IN_NETWORK), elements, 1e9)
    wide_p = cost_model.predict(make_schedule(star, IN_NETWORK), elements, 1e9, wire=wide)
    assert wide.frame_bytes == 8890 and wide.blocks == 69
    assert 64 * 8890 < wide_p.max_up < narrow_p.max_up
    assert cost_model.payload_share(wide) > 0.99 > 0.82 > cost_model.payload_share()


def test_a_nics_channels_share_one_budget_of_frames_in_flight():
    """bcube:3,2 mixed: two channels per NIC (a reduce-scatter, an allreduce) beside TCP
    streams, so they share the link's queue; in-network: no streams, the whole queue (the
    in-flight cap); host-based: no channels, the streams keep what they always had. The
    channels use more slots than that (DEFAULT_WINDOW): the rest wait for room."""
    topo = Topology.parse("bcube:3,2")
    in_flight = nic_in_flight(make_schedule(topo, MIXED), 4)
    assert in_flight == [SHARED_FRAME_BUDGET // (2 * FRAME_WIRE_BYTES)] * 2
    assert stream_budgets(make_schedule(topo, MIXED), 4) == [SHARED_STREAM_BUDGET] * 2
    assert SHARED_FRAME_BUDGET + SHARED_STREAM_BUDGET < LINK_QUEUE_BYTES
    assert stream_budgets(make_schedule(topo, HOST_BASED), 4) == [QUEUE_BUDGET] * 2
    assert STREAM_BUDGET == QUEUE_BUDGET
    assert nic_in_flight(make_schedule(topo, IN_NETWORK), 4) == [IN_FLIGHT, IN_FLIGHT]
    assert nic_in_flight(make_schedule(topo, IN_NETWORK), 4, 1024) == [
        LINK_QUEUE_BYTES // (2 * FRAME_WIRE_BYTES)] * 2
    assert nic_in_flight(make_schedule(topo, HOST_BASED), 4) == [IN_FLIGHT, IN_FLIGHT]
    assert nic_in_flight(make_schedule(Topology.parse("star:4"), IN_NETWORK), 0, 64) == [64]
    assert DEFAULT_WINDOW >= 2 * IN_FLIGHT


def test_planner_picks_the_least_predicted_gst():
    for spec in ("star:4", "bcube:2,2", "bcube:3,2", "bcube:4,2", "bcube:2,3"):
        topo = Topology.parse(spec)
        ranked = cost_model.plan(topo, 1 << 20, 10e6)
        assert ranked[0].gst == min(p.gst for p in ranked)
        assert cost_model.choose(topo, 1 << 20) == ranked[0].schedule
    assert cost_model.choose(Topology.parse("star:4"), 1 << 20).name == IN_NETWORK


def test_scheduled_job_gives_every_switch_one_group_per_stripe():
    topo = Topology.parse("bcube:3,2")
    plan = plan_scheduled_job(topo, 7)
    assert len(plan.groups) == topo.num_switches * topo.k
    for group in plan.groups:
        sw = topo.switch(group.switch)
        stripe = (group.job_id - 7) // 512
        assert group.job_id == stripe_job_id(7, stripe)
        assert group.result_mode == (ResultMode.TO_OWNER if sw.level == stripe
                                     else ResultMode.MULTICAST)
        assert group.members == {topo.digits(s)[sw.level]: sw.port_of(s) for s in sw.servers}
    pools = {}
    for group in plan.groups:
        pools.setdefault(group.switch, []).append((group.pool_base, group.pool_size))
    for spans in pools.values():
        spans.sort()
        assert all(a[0] + a[1] <= b[0] for a, b in pairwise(spans))
    with pytest.raises(JobError, match=r"1\.\.511"):
        plan_scheduled_job(topo, 600)
    with pytest.raises(JobError, match="already set up"):
        plan_scheduled_job(topo, 7, existing=plan.groups)


# --- degraded schedules: a failed group runs its level in the hosts, over detours -----------

@pytest.mark.parametrize("spec,broken", [("bcube:2,2", (1, 0)), ("bcube:3,2", (0, 1)),
                                         ("bcube:2,3", (2, 3))])
@pytest.mark.parametrize("name", [IN_NETWORK, MIXED])
def test_a_broken_group_runs_its_level_in_the_hosts_and_nothing_else_changes(spec, broken,
                                                                            name):
    topo = Topology.parse(spec)
    healthy = make_schedule(topo, name)
    schedule = healthy.degraded({broken})
    level, index = broken
    members = topo.switch_at(level, index).servers
    healthy_layout, layout = Layout(healthy, 1009), Layout(schedule, 1009)
    for server in range(topo.num_servers):
        for p in range(topo.k):
            steps = schedule.steps_of(p, server)
            if server in members:
                assert all(s.switch_share == 0 for s in steps if s.dim == level)
                assert Op.AR not in [s.op for s in steps if s.dim == level]
            else:
                assert steps == healthy.stripes[p]
            # what every server owns after the healthy plan's steps is the same: the groups
            # that still use their switches meet the same pieces
            depth = len(healthy.rs_dims(p))
            assert layout.pieces(p, server)[:depth + 1] == healthy_layout.pieces(p, server)
        if server in members:  # the failed switch carries nothing
            nic = traffic(layout, server)[level]
            assert nic.up.payload_blocks() == nic.down.payload_blocks() == 0
            assert nic.up.stream_overhead == nic.down.stream_overhead == 0
    for lvl in range(topo.k):  # every byte up into a level's switches comes down again
        nics = [traffic(layout, s)[lvl] for s in range(topo.num_servers)]
        assert (sum(n.up.stream_blocks for n in nics) == sum(n.down.stream_blocks for n in nics))
        assert (sum(n.up.stream_overhead for n in nics)
                == sum(n.down.stream_overhead for n in nics))
    assert schedule.code != healthy.code
    assert cost_model.predict(schedule, 1 << 20, 10e6).gst > \
        cost_model.predict(healthy, 1 << 20, 10e6).gst


def test_re_planning_is_refused_where_there_is_no_other_path():
    with pytest.raises(ScheduleError, match="no other path"):
        make_schedule(Topology.parse("star:4"), IN_NETWORK).degraded({(0, 0)})
    bcube = make_schedule(Topology.parse("bcube:3,2"), IN_NETWORK)
    with pytest.raises(ScheduleError, match="s0_0 and s0_1 both failed"):
        bcube.degraded({(0, 0), (0, 1)})
    with pytest.raises(ScheduleError, match="both failed"):
        bcube.degraded({(0, 0)}).degraded({(1, 2)})


def test_an_elastic_job_is_recorded_and_only_on_a_star():
    plan = plan_scheduled_job(Topology.parse("star:4"), 3, IN_NETWORK, elastic=True)
    assert plan.elastic and type(plan).from_json(plan.to_json()).elastic
    with pytest.raises(JobError, match="on a star only"):
        plan_scheduled_job(Topology.parse("bcube:2,2"), 3, IN_NETWORK, elastic=True)


def test_only_a_stars_in_network_mesh_is_control_only():
    """The short TCP timeout (hosts.mesh.CONTROL_RTO_MIN_US) is for a mesh that carries only
    the exponent exchange and DONE; streams and broadcast repairs wait behind frames."""
    assert mesh_is_control_only(make_schedule(Topology.parse("star:4"), IN_NETWORK), 0)
    for spec in ("bcube:2,2", "bcube:3,2"):
        for name in (IN_NETWORK, HOST_BASED, MIXED):
            assert not mesh_is_control_only(make_schedule(Topology.parse(spec), name), 0)
