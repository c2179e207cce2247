"""The PTF packet tests (tests/ptf), run against the software target and against BMv2, at the
default width (64 lanes) and at the widest build (2208 lanes).

One PTF run per target and width (a switch start each); every PTF test is then reported as its
own pytest test. The PTF tests load the pipeline of the width given as test parameter ``lanes``
and take the width from its P4Info. The BMv2 runs skip, saying why, when simple_switch_grpc is
not installed; at the widest width BMv2 (which interprets every one of a packet's thousands of
lane actions) runs a representative subset, the software target the whole suite.
"""

from __future__ import annotations

import os
import re

import pytest

from bml.protocol import DEFAULT_LANES, WIDEST_LANES
from emulation.net import BMV2_MISSING, find_bmv2
from emulation.testbed import PTF_DIR, SwitchTestbed, have_netns

# What BMv2 runs at the widest width: every control and the width's own rules, among them
# a PROBE into a completed copy, which is answered MISSING there: BMv2 gives a packet 512
# bytes to grow by (simple_switch: PacketBuffer(len + 512)), and the stored sum would grow
# the 58-byte probe by every lane.
WIDE_BMV2_SUBSET = (
    "aggregation.ThreeWorkers", "aggregation.SumsWrapLikeInt32",
    "aggregation.DuplicateIgnored", "aggregation.PendingToSenderOnly",
    "aggregation.ProbeAnsweredByTheCopysState", "aggregation.ProbeOnToOwnerJob",
    "aggregation.ProbeOfACompleteWideCopyThenTheFrame",
    "aggregation.RetransmissionAfterCompletion", "aggregation.ShadowCopiesAndSlotReuse",
    "aggregation.ResetThroughPacketOut", "result_routing.ResultToOwner",
    "result_routing.Broadcast", "generation.QueryAnsweredToSenderOnly",
    "generation.OlderCallAnsweredNotAdded", "admission.ShortPacket",
    "admission.ProbeWithTrailer", "admission.ContributionOfAnotherWidth",
    "admission.CountNotTheWidth", "admission.ProbeOfAnotherWidth",
    "admission.ResetOfAnotherWidth", "admission.QuestionOfAnotherWidthAnswered",
    "admission.GenerationQuestionWithLanes", "malformed.TrailingBytes",
    "malformed.Ipv4LengthDisagrees", "malformed.ControllerFrameWithTrailingBytes",
)


def ptf_test_names() -> list[str]:
    names = []
    for path in sorted(PTF_DIR.glob("*.py")):
        for cls in re.findall(r"^class (\w+)\((?:\w+, )?BmlTest\):", path.read_text(), re.M):
            names.append(f"{path.stem}.{cls}")
    return names


NETNS_REASON = have_netns()
_BMV2 = pytest.mark.skipif(find_bmv2() is None, reason=BMV2_MISSING)
TARGETS = [
    pytest.param(("soft", DEFAULT_LANES), id="soft"),
    pytest.param(("bmv2", DEFAULT_LANES), id="bmv2", marks=_BMV2),
    pytest.param(("soft", WIDEST_LANES), id=f"soft-{WIDEST_LANES}"),
    pytest.param(("bmv2", WIDEST_LANES), id=f"bmv2-{WIDEST_LANES}", marks=_BMV2),
]
_results: dict[tuple[str, int], tuple[dict[str, str], str, list[str] | None]] = {}


def subset(target: str, lanes: int) -> list[str] | None:
    """The PTF tests a run holds (None: all)."""
    return list(WIDE_BMV2_SUBSET) if (target, lanes) == ("bmv2", WIDEST_LANES) else None


@pytest.fixture(scope="module", params=TARGETS)
def ptf_results(request, tmp_path_factory):
    """(outcome per PTF test, the run's log folder, the tests it ran or None for all)."""
    if NETNS_REASON:
        pytest.skip(NETNS_REASON)
    target, lanes = request.param
    if request.param not in _results:
        # A namespace of this run's own: others may run the suite at the same time.
        net = SwitchTestbed(target, f"bmlptf{target[0]}{lanes}{os.getpid()}",
                            tmp_path_factory.mktemp(f"ptf-{target}-{lanes}"))
        try:
            tests = subset(target, lanes)
            _results[request.param] = (net.run_ptf(tests, lanes=lanes), str(net.log_dir), tests)
        finally:
            net.close()
    return _results[request.param]


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
                     "admission.CountNotTheWidth", "admission.ContributionOfAnotherWidth",
                     "admission.QuestionOfAnotherWidthAnswered"):
        assert required in names
    assert set(WIDE_BMV2_SUBSET) <= set(names)


@pytest.mark.netns
@pytest.mark.parametrize("name", ptf_test_names())
def test_packet(ptf_results, name):
    outcomes, log_dir, ran = ptf_results
    if ran is not None and name not in ran:
        pytest.skip(f"BMv2 at {WIDEST_LANES} lanes runs a representative subset "
                    f"(WIDE_BMV2_SUBSET); the software target runs every test at that width")
    outcome = outcomes.get(name)
    assert outcome == "ok", f"PTF {name}: {outcome or 'did not run'} (logs in {log_dir})"
