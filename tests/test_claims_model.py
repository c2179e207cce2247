"""The cost model of every scheme (bml/cost_model.py) against figures derived by hand: the
baselines' bytes per NIC with every header, the closed forms for any BCube against the
schedules' own traffic, switch counts, and the seed's "1/k of the GST with k/5 of the
switches" (reproduced for k = 2 with even n >= 4, corrected beyond)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from bml import cost_model as cm
from bml.schedule import HOST_BASED, IN_NETWORK, MIXED, ideal_cost, make_schedule
from bml.topology import Topology

SEG = 9000 - 20 - 32  # TCP payload per segment at MTU 9000, timestamps on
HDR = 66  # Ethernet + IPv4 + TCP with timestamps


def tcp_up(sent: float, received: float) -> float:
    """By hand: payload, a header per segment, and a 66-byte ACK per two segments received."""
    return sent + sent / SEG * HDR + received / SEG / 2 * HDR


def test_sharded_ps_bytes_per_nic():
    # N = 4, shards of 16384 values: four messages of 4096 values with a 12-byte header.
    p = cm.predict_ps(4 * 16384, 4, 10e6)
    message = 4 * 16384 + 4 * 12
    sent = 3 * message + 3 * message  # pushes to 3 holders, sums of my shard to 3 workers
    assert p.max_up == pytest.approx(tcp_up(sent, sent))
    assert p.max_down == pytest.approx(tcp_up(sent, sent))
    assert p.gst == pytest.approx(tcp_up(sent, sent) * 8 / 10e6)
    assert p.switches == 1 and p.scheme == cm.PS


def test_dedicated_ps_server_is_the_bottleneck():
    # 9 workers, 3 PS servers: a server receives 9 shards of 16384 values and sends 9 sums.
    p = cm.predict_ps(3 * 16384, 9, 1e6, servers=3)
    message = 4 * 16384 + 4 * 12
    assert len(p.nic_bytes) == 12
    assert p.nic_bytes[0][0][0] == pytest.approx(tcp_up(3 * message, 3 * message))
    assert p.nic_bytes[11][0][0] == pytest.approx(tcp_up(9 * message, 9 * message))
    assert p.busiest == p.nic_bytes[11][0][0]


def test_ring_and_ps_carry_two_n_minus_one_over_n():
    assert cm.baseline_load(9) == Fraction(16, 9)
    ring = cm.predict_ring(9 * 1000, 9, 1e6)
    payload = 2 * 8 / 9 * 4 * 9000
    assert ring.max_up == pytest.approx(tcp_up(payload, payload))


def test_single_switch_counts_priming_and_flush_uses():
    # 1000 chunks on 256 slots: slots 0..231 carry 4 chunks (+1 priming = 5, +1 flush = 6),
    # slots 232..255 carry 3 (+1 = 4): 232 * 6 + 24 * 4 frames each way.
    assert cm.single_switch_frames(64 * 1000) == 232 * 6 + 24 * 4
    p = cm.predict_single_switch(64 * 1000, 9, 2e6)
    assert p.max_up == p.max_down == 1488 * 314
    assert cm.predict_schedule(make_schedule(Topology.parse("star:4"), IN_NETWORK),
                               4096, 1e6).scheme == cm.SINGLE_SWITCH


@pytest.mark.parametrize("n,k", [(2, 2), (3, 2), (4, 2), (5, 2), (2, 3), (3, 3)])
@pytest.mark.parametrize("scheme", [HOST_BASED, IN_NETWORK, MIXED])
def test_closed_form_matches_the_schedules_traffic(n, k, scheme):
    load = cm.bcube_load(n, k, scheme)
    assert (load.up, load.down) == ideal_cost(make_schedule(Topology(n, k), scheme))


def test_design_figures_per_gradient_on_bcube32_and_star9():
    # DESIGN.md: PS and ring 1.78 G, single switch 1.0 G, host-based 0.89 G, in-network
    # 0.83 G, mixed 0.75 G per NIC (payload; a stripe is G / 2).
    assert cm.baseline_load(9) == Fraction(16, 9)
    per_g = {s: max(cm.bcube_load(3, 2, s).up, cm.bcube_load(3, 2, s).down) / 2
             for s in (HOST_BASED, IN_NETWORK, MIXED)}
    assert per_g == {HOST_BASED: Fraction(8, 9), IN_NETWORK: Fraction(5, 6), MIXED: Fraction(3, 4)}
    # ACK frames for the RS chunks a NIC does not own
    assert cm.bcube_load(3, 2, IN_NETWORK).down_acks == Fraction(2, 3)


def test_wire_bytes_favour_host_based_on_bcube32_and_in_network_on_wide_switches():
    # 314-byte frames carry 256 gradient bytes: 5/3 * 314/256 = 2.044 S up in-network against
    # 16/9 * (1 + 16/4096) * (1 + 66/8948) + ACKs = 1.800 S host-based.
    up_in, _ = cm.bcube_load(3, 2, IN_NETWORK).wire()
    up_host, _ = cm.bcube_load(3, 2, HOST_BASED).wire()
    assert up_in == pytest.approx(5 / 3 * 314 / 256)
    assert up_host == pytest.approx(16 / 9 * (1 + 16 / 4096) * (1 + 66 / SEG + 33 / SEG))
    assert up_in > up_host
    row = cm.claim_row(64, 2)
    assert row.gst_ratio[IN_NETWORK] < row.gst_ratio[HOST_BASED]


def test_switch_counts():
    assert cm.bcube_switches(3, 2) == 6 == Topology(3, 2).num_switches
    assert cm.bcube_switches(2, 3) == 12
    assert cm.fat_tree(16, 4) == (3, 20)  # the 4-ary Fat-Tree: 16 servers, 20 switches
    assert cm.fat_tree(64, 8) == (3, 40)  # half of the 8-ary one (128 servers, 80 switches)
    assert cm.fat_tree(4, 4) == (1, 1)
    assert cm.fat_tree(9, 3) is None  # 3-port switches: one port down, no tree grows


def test_the_seed_claims_reproduced_for_k2_and_corrected_beyond():
    # 1/k of PS's GST: host-based exactly (payload), in wire bytes within the 16-byte message
    # headers of the host exchange.
    for n, k in [(4, 2), (8, 3), (4, 4)]:
        row = cm.claim_row(n, k)
        assert row.payload_ratio[HOST_BASED] == pytest.approx(1 / k)
        assert row.gst_ratio[HOST_BASED] == pytest.approx(1 / k, rel=0.01)
    # k/5 of the switches: BCube(n, 2) has 2n, a 3-layer Fat-Tree of n-port switches 5n.
    assert cm.claim_row(4, 2).switch_ratio == pytest.approx(2 / 5)
    assert cm.claim_row(16, 2).switch_ratio == pytest.approx(2 / 5)
    # k = 3: n^3 servers need a 4th layer (n^3 > n^3/4): 3n^2 against 7n^2, 3/7 not 3/5.
    assert cm.claim_row(8, 3).switch_ratio == pytest.approx(3 / 7)
    # payload GST ratios on BCube(3,2): 1/2, 15/32, 27/64
    row = cm.claim_row(3, 2)
    assert row.payload_ratio == pytest.approx({HOST_BASED: 1 / 2, IN_NETWORK: 15 / 32,
                                               MIXED: 27 / 64})
    table = cm.claim_table()
    assert min(r.servers for r in table) == 9 and max(r.servers for r in table) == 4096
    assert all(r.k >= 2 for r in table)
