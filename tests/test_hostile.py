"""Hostile traffic (tests/hostile.py): random, malformed and forged frames sent into the
switches from the servers' NICs while every worker pushes; no crash, every sum right, every
drop counted under its reason. The full run is a command:
``.venv/bin/python -m tests.hostile --packets 100000 --target soft|bmv2 [--topo bcube:2,2]``."""

from __future__ import annotations

from collections import Counter

import pytest

from bml.protocol import DropReason
from bml.topology import Topology
from emulation.net import BMV2_MISSING, find_bmv2
from tests.conftest import NETNS_REASON
from tests.hostile import (
    CLASSES,
    Generator,
    Hostile,
    check_in_process,
    plan_groups,
    run,
    topology_links,
)

SIZE = {"soft": 1 << 17, "bmv2": 1 << 15}


@pytest.mark.parametrize("spec", ["star:4", "bcube:2,2"])
def test_every_frame_moves_the_counter_its_class_names(spec):
    """The generator against the software target's pipeline in this process: each frame
    moves exactly the one counter its class names (here no other traffic moves any)."""
    frames, differences = check_in_process(spec, 3000, 11)
    assert not differences, "\n".join(differences[:10])
    assert {f.kind for f in frames} == set(CLASSES)
    reasons = {CLASSES[f.kind] for f in frames}
    # Every drop reason a host can cause (NO_OWNER needs an owner with no route, STALE a
    # copy filling with another offset: neither is a frame's own fault).
    for reason in set(DropReason) - {DropReason.NO_OWNER, DropReason.STALE}:
        assert f"drop:{reason.name}" in reasons, reason


def make(seed: int, packets: int = 500) -> list[Hostile]:
    topology = Topology.parse("bcube:2,2")
    return Generator(topology_links(topology), plan_groups(topology), {}, seed) \
        .generate(packets)


def test_same_seed_same_frames_every_class_alike():
    assert [h.frame for h in make(3)] == [h.frame for h in make(3)]
    assert [h.frame for h in make(3)] != [h.frame for h in make(4)]
    shares = Counter(h.kind for h in make(5, 21 * 10)).values()
    assert set(shares) == {10}  # a deck of every class: equal shares


BMV2 = [pytest.mark.bmv2, pytest.mark.skipif(find_bmv2() is None, reason=BMV2_MISSING)]


@pytest.mark.netns
@pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")
@pytest.mark.parametrize(("target", "spec", "packets"), [
    ("soft", "star:4", 6000),
    ("soft", "bcube:2,2", 4000),
    pytest.param("bmv2", "star:4", 2000, marks=BMV2),
])
def test_hostile_traffic_during_a_push(target, spec, packets, tmp_path):
    name = f"thos{target[0]}{spec[0]}"
    report = run(spec, target, packets, 1, tmp_path, name, SIZE[target])
    print(report.text())
    assert report.clean, report.text()
    assert report.send["sent"] == packets
    assert report.send["during_push"] > 0
