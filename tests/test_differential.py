"""The software target is the P4 program: seeded random packet sequences (tests/diffgen.py)
hold it to the invariants any target must keep, always, and to simple_switch_grpc byte for
byte and counter for counter when BMv2 is installed (tests/diffrun.py). A longer run:
``.venv/bin/python -m tests.diffrun --packets 5000 --seed 7`` (README, "BMv2")."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from bml.protocol import CPU_PORT, DropReason, Stat
from emulation.net import BMV2_MISSING, find_bmv2
from emulation.testbed import have_netns
from tests.diffgen import generate
from tests.diffrun import DualTestbed, InProcessTarget, Report, run

VETH_PACKETS = 300  # ~15 s on both targets; BML_DIFF_PACKETS / BML_DIFF_SEED for another run
VETH_SEED = 5  # a seed whose first VETH_PACKETS reach every kind (checked below)
NETNS_REASON = have_netns()


def failure(report: Report) -> str:
    return (f"seed {report.seed}: {report.against_expected} packets differ from what they "
            f"must do, {report.between_targets} between the targets"
            f"{' (stopped early)' if report.stopped_early else ''}:\n"
            + json.dumps(report.differences[:5], indent=1))


def test_same_seed_same_sequence():
    first, again, other = generate(5, 300), generate(5, 300), generate(6, 300)
    assert [e.wire() for e in first] == [e.wire() for e in again]
    assert [e.wire() for e in first] != [e.wire() for e in other]


def test_sequence_reaches_every_counter_and_kind():
    """The few hundred packets of a veth run already move every stat and every drop reason,
    send copies to a port with no host address, and hold every kind of frame the generator
    makes (PacketOuts and frames forwarded to hosts included)."""
    events = generate(VETH_SEED, VETH_PACKETS)
    stats, drops = Counter(), Counter()
    for event in events:
        stats.update(event.expect.stats)
        drops.update(event.expect.drops)
    assert set(stats) == set(Stat), set(Stat) - set(stats)
    assert set(drops) == set(DropReason), set(DropReason) - set(drops)
    assert sum(e.expect.unaddressed for e in events) > 0
    kinds = {e.kind for e in events}
    for kind in ("data", "pending", "retx", "late copy", "stale", "broadcast", "reset",
                 "probe pending", "probe missing", "probe retx",
                 "generation query", "generation query with lanes", "old call", "new call data",
                 "bad width", "another width",
                 "malformed vlan", "malformed qinq", "malformed version", "malformed trailing",
                 "malformed mf", "malformed options", "packet-out, reset tail",
                 "control l2_forward default forward_to"):
        assert kind in kinds, kind
    assert any(k.endswith("to a host") for k in kinds)
    assert any(e.port == CPU_PORT and e.expect.outputs for e in generate(1, 3000))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_software_target_keeps_the_invariants(seed):
    """Every result is the wrapping int32 sum of its round's contributions, nothing refused
    changes a later frame, every packet moves exactly the counters it must (its pipeline, in
    this process)."""
    with InProcessTarget() as target:
        report = run([target], generate(seed, 1500), seed)
    assert report.packets == 1500
    assert report.clean, failure(report)


def veth_run(tmp_path: Path, bmv2: str | None) -> Report:
    seed = int(os.environ.get("BML_DIFF_SEED", str(VETH_SEED)))
    packets = int(os.environ.get("BML_DIFF_PACKETS", str(VETH_PACKETS)))
    # td<pid>: a namespace of this run's own, whoever else runs tests at the same time.
    testbed = DualTestbed(f"td{os.getpid()}", tmp_path, bmv2)
    try:
        report = testbed.drive(seed, packets)
    finally:
        testbed.close()
    assert report.clean, failure(report)
    assert report.packets == packets
    return report


@pytest.mark.netns
@pytest.mark.skipif(NETNS_REASON is not None, reason=str(NETNS_REASON))
def test_software_target_on_veths_keeps_the_invariants(tmp_path):
    """The same, through the switch process on real veths (AF_PACKET, the VLAN tag the
    kernel takes out put back, PacketOut over P4Runtime)."""
    assert veth_run(tmp_path, None).targets == ["soft"]


@pytest.mark.netns
@pytest.mark.bmv2
@pytest.mark.skipif(NETNS_REASON is not None, reason=str(NETNS_REASON))
@pytest.mark.skipif(find_bmv2() is None, reason=BMV2_MISSING)
def test_software_target_and_bmv2_agree(tmp_path):
    """The same packets, one at a time, to both targets on veths: the same frames out and the
    same counters, and both as expected."""
    assert veth_run(tmp_path, find_bmv2()).targets == ["soft", "bmv2"]
