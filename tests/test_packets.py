"""The PTF packet tests (tests/ptf), run against the software target and against BMv2.

One PTF run per target (a switch start each); every PTF test is then reported as its own
pytest test. The BMv2 runs skip, saying why, when simple_switch_grpc is not installed.
"""

from __future__ import annotations

import os
import re

import pytest

from emulation.net import BMV2_MISSING, find_bmv2
from emulation.testbed import PTF_DIR, SwitchTestbed, have_netns


def ptf_test_names() -> list[str]:
    names = []
    for path in sorted(PTF_DIR.glob("*.py")):
        for cls in re.findall(r"^class (\w+)\((?:\w+, )?BmlTest\):", path.read_text(), re.M):
            names.append(f"{path.stem}.{cls}")
    return names


NETNS_REASON = have_netns()
TARGETS = [
    pytest.param("soft", id="soft"),
    pytest.param("bmv2", id="bmv2", marks=pytest.mark.skipif(
        find_bmv2() is None, reason=BMV2_MISSING)),
]
_results: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module", params=TARGETS)
def ptf_results(request, tmp_path_factory):
    if NETNS_REASON:
        pytest.skip(NETNS_REASON)
    target = request.param
    if target not in _results:
        # A namespace of this run's own: others may run the suite at the same time.
        net = SwitchTestbed(target, f"bmlptf{target}{os.getpid()}",
                            tmp_path_factory.mktemp(f"ptf-{target}"))
        try:
            _results[target] = net.run_ptf()
            _results[target]["__log__"] = str(net.log_dir)
        finally:
            net.close()
    return _results[target]


def test_ptf_suite_found_every_test():
    names = ptf_test_names()
    assert len(names) >= 25, names
    for required in ("aggregation.TwoWorkers", "aggregation.ThreeWorkers",
                     "aggregation.EightWorkers", "aggregation.DuplicateIgnored",
                     "aggregation.RetransmissionAfterCompletion",
                     "aggregation.ShadowCopiesAndSlotReuse", "aggregation.MaxExponent",
                     "result_routing.ResultToOwner", "result_routing.Broadcast",
                     "aggregation.TwoJobsIsolated", "forwarding.ForwardByMac",
                     "admission.UnknownJob", "admission.ForgedWorkerId",
                     "admission.WrongIngressPort", "admission.ShortPacket",
                     "admission.BadValueCount"):
        assert required in names


@pytest.mark.netns
@pytest.mark.parametrize("name", ptf_test_names())
def test_packet(ptf_results, name):
    outcome = ptf_results.get(name)
    assert outcome == "ok", (f"PTF {name}: {outcome or 'did not run'} "
                             f"(logs in {ptf_results['__log__']})")
