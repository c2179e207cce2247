"""The topology maths against DESIGN.md's definition of BCube(n, k) and the star."""

from __future__ import annotations

import itertools

import pytest

from bml.protocol import POOL_SLOTS
from bml.topology import Topology, TopologyError, server_of_ip
from control_plane.jobs import JobError, allocate_pool, plan_job


@pytest.mark.parametrize(("n", "k"), [(2, 1), (4, 1), (2, 2), (3, 2), (4, 2), (2, 3), (3, 3)])
def test_counts(n, k):
    topo = Topology(n, k)
    assert topo.num_servers == n ** k
    assert len(topo.switches) == k * n ** (k - 1) == topo.num_switches
    assert all(len(sw.servers) == n for sw in topo.switches)
    assert len({sw.name for sw in topo.switches}) == len(topo.switches)
    assert sorted(sw.device_id for sw in topo.switches) == list(range(1, topo.num_switches + 1))


@pytest.mark.parametrize(("n", "k"), [(2, 2), (3, 2), (2, 3), (3, 3)])
def test_level_switch_joins_servers_differing_only_in_that_digit(n, k):
    topo = Topology(n, k)
    for sw in topo.switches:
        digits = [topo.digits(s) for s in sw.servers]
        for a, b in itertools.combinations(digits, 2):
            differing = [lvl for lvl in range(k) if a[lvl] != b[lvl]]
            assert differing == [sw.level]
        assert sorted(d[sw.level] for d in digits) == list(range(n))


@pytest.mark.parametrize(("n", "k"), [(2, 2), (3, 2), (4, 1), (2, 3)])
def test_every_nic_on_exactly_one_switch_port(n, k):
    topo = Topology(n, k)
    seen = {}
    for server in range(topo.num_servers):
        nics = topo.nics(server)
        assert [nic.level for nic in nics] == list(range(k))
        for nic in nics:
            key = (nic.switch, nic.port)
            assert key not in seen, f"{key} used by {seen[key]} and server {server}"
            seen[key] = server
            sw = topo.switch(nic.switch)
            assert sw.level == nic.level and sw.servers[nic.port - 1] == server
            assert nic.port == topo.digits(server)[nic.level] + 1
    assert len(seen) == sum(len(sw.servers) for sw in topo.switches) == k * topo.num_servers


def test_neighbours_bcube_3_2():
    topo = Topology.parse("bcube:3,2")
    # server 4 = digits (1, 1): level 0 joins 3, 4, 5; level 1 joins 1, 4, 7
    assert topo.digits(4) == (1, 1)
    assert set(topo.neighbours(4, 0)) == {3, 5}
    assert set(topo.neighbours(4, 1)) == {1, 7}
    assert topo.switches[0].name == "s0_0" and topo.switches[3].name == "s1_0"


def test_addressing_plan_subnet_per_level_unique_addresses():
    topo = Topology.parse("bcube:3,2")
    ips = [nic.ip for s in range(topo.num_servers) for nic in topo.nics(s)]
    macs = [nic.mac for s in range(topo.num_servers) for nic in topo.nics(s)]
    macs += [sw.mac for sw in topo.switches]
    ips += [sw.ip for sw in topo.switches]
    assert len(set(ips)) == len(ips) and len(set(macs)) == len(macs)
    for s in range(topo.num_servers):
        for nic in topo.nics(s):
            assert nic.ip.startswith(f"10.{nic.level + 1}.")
    for sw in topo.switches:
        assert sw.ip.startswith(f"10.{sw.level + 1}.255.")


def test_star_is_one_switch():
    topo = Topology.parse("star:4")
    assert (topo.n, topo.k, topo.kind, topo.spec) == (4, 1, "star", "star:4")
    assert [sw.name for sw in topo.switches] == ["s0"]
    assert [topo.nics(s)[0].port for s in range(4)] == [1, 2, 3, 4]


@pytest.mark.parametrize("spec", ["bcube:1,2", "bcube:3,0", "star:1", "mesh:3", "bcube:3",
                                  "star:x", "bcube:16,4", "bcube:2,12"])
def test_bad_topologies_are_refused(spec):
    with pytest.raises(TopologyError):
        Topology.parse(spec)


def test_job_planning_star_and_bcube_levels():
    star = plan_job(Topology.parse("star:4"), 1, [0, 1, 2, 3])
    assert [(g.switch, g.members) for g in star.groups] == [("s0", {0: 1, 1: 2, 2: 3, 3: 4})]
    topo = Topology.parse("bcube:3,2")
    level1 = plan_job(topo, 2, list(range(9)), level=1)
    assert [g.switch for g in level1.groups] == ["s1_0", "s1_1", "s1_2"]
    for group in level1.groups:
        sw = topo.switch(group.switch)
        assert group.members == {topo.digits(s)[1]: sw.port_of(s) for s in sw.servers}


def test_pools_never_overlap_and_run_out_clearly():
    topo = Topology.parse("star:4")
    first = plan_job(topo, 1, [0, 1], pool_size=1000)
    second = plan_job(topo, 2, [2, 3], pool_size=1000, existing=first.groups)
    a, b = first.groups[0], second.groups[0]
    assert a.pool_base + a.pool_size <= b.pool_base
    with pytest.raises(JobError, match="free slots"):
        allocate_pool(POOL_SLOTS - 1000, first.groups + second.groups)
    with pytest.raises(JobError, match="already set up"):
        plan_job(topo, 1, [0, 1], existing=first.groups)
    with pytest.raises(JobError, match="not in star:4"):
        plan_job(topo, 3, [0, 9])


@pytest.mark.parametrize("spec", ["bcube:2,2", "bcube:3,2", "bcube:2,3", "bcube:3,3"])
def test_detour_routes_take_every_failed_group_around_its_switch_in_three_hops(spec):
    """Follow the host routes hop by hop, as the kernels would: from every member of a group
    to every other, addressed on the detour level m, the packet goes to the sender's relay
    (level m), to the receiver's relay (level l) and to the receiver (level m), never through
    the group's own switch, and every hop is to a neighbour on a working switch."""
    topo = Topology.parse(spec)
    owner = {nic.ip: (nic.server, nic.level) for s in range(topo.num_servers)
             for nic in topo.nics(s)}
    routes = {s: {dest: (via, dev) for dest, via, dev in topo.detour_routes(s)}
              for s in range(topo.num_servers)}
    for switch in topo.switches:
        level = switch.level
        m = topo.detour_level(level)
        for source in switch.servers:
            for target in switch.servers:
                if source == target:
                    continue
                destination = topo.nics(target)[m].ip
                path, at = [source], source
                while at != target:
                    assert len(path) <= 4, path
                    if destination in routes[at]:
                        via, dev = routes[at][destination]
                        after, hop_level = owner[via]
                        assert dev == f"eth{hop_level}"
                    else:  # on-link: the destination is on this server's level-m switch
                        after, hop_level = target, m
                    assert after in topo.neighbours(at, hop_level), (path, after)
                    assert (hop_level, topo.switch_index(at, hop_level)) != (level,
                                                                             switch.index)
                    path.append(after)
                    at = after
                assert path == [source, topo.relay(source, level), topo.relay(target, level),
                                target]


def test_a_star_has_no_detour():
    topo = Topology.parse("star:4")
    assert topo.detour_routes(0) == []
    with pytest.raises(TopologyError, match="no other path"):
        topo.relay(0, 0)


@pytest.mark.parametrize("spec", ["bcube:64,2", "bcube:16,3"])
def test_the_addressing_plan_numbers_4096_servers_and_their_switches_apart(spec):
    """The scale benchmark's largest BCubes: every NIC's address maps back to its server and
    level, and no switch address is a server's or another switch's."""
    topo = Topology.parse(spec)
    nics = [nic for s in range(topo.num_servers) for nic in topo.nics(s)]
    assert all(server_of_ip(nic.ip) == (nic.server, nic.level) for nic in nics)
    switch_ips = [sw.ip for sw in topo.switches]
    assert len(set(switch_ips)) == len(switch_ips)
    assert not set(switch_ips) & {nic.ip for nic in nics}
    for ip in switch_ips:
        with pytest.raises(TopologyError):
            server_of_ip(ip)
