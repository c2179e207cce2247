"""Differential runs: one seeded sequence (tests/diffgen.py) through the software target and
through BMv2, one packet at a time, every frame that leaves and every counter compared with
what the packet must do and between the two targets.

    .venv/bin/python -m tests.diffrun --packets 5000 --seed 7      # both targets on veths (root)
    .venv/bin/python -m tests.diffrun --soft-only --packets 2000    # its process on veths alone
    .venv/bin/python -m tests.diffrun --in-process --packets 20000  # its pipeline alone

Both switches run in one network namespace of their own (``td<pid>``): the software target on
veths sN/aN with P4Runtime on 127.0.0.1:9559, simple_switch_grpc on bN/cN with P4Runtime on
127.0.0.1:9560. The driver (``drive``, run inside the namespace) configures both through the
control plane's own code, sends each packet on aN and cN, and waits for each target's counters
to move before it collects what came out. Switches end by PID; the namespace is deleted.
The targets and the testbed are ``tests.kit.targets``; this module is the run and its CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bml.topology import Switch
from control_plane.provision import install_group
from control_plane.session import SwitchSession
from tests.diffgen import JOBS, PORTS, generate, table_entries
from tests.kit import targets as kit_targets
from tests.kit.oracle import Event, Observation
from tests.kit.targets import BMV2_GRPC, SOFT_GRPC, VethTarget

MAX_REPORTED = 20  # differing packets reported; the run stops there (a wrong target is slow)
# The switch object the control plane's RESET frames take addresses from (PacketOut frames
# are not forwarded, so which addresses does not matter).
_SWITCH = Switch("dut", 0, 0, 1, PORTS)


def configure(session: SwitchSession) -> None:
    """The scenario through the control plane: pipeline, addresses, routes, jobs."""
    session.push_pipeline()
    session.write_entries(table_entries())
    for job in JOBS:
        install_group(session, _SWITCH, job.group)


class InProcessTarget(kit_targets.InProcessTarget):
    """The software target's pipeline in this process, configured with the scenario."""

    def __init__(self) -> None:
        super().__init__(configure)


# ---------------------------------------------------------------------------- the run
@dataclass
class Report:
    packets: int = 0
    seed: int = 0
    targets: list[str] = field(default_factory=list)
    against_expected: dict[str, int] = field(default_factory=dict)
    between_targets: int = 0
    differences: list[dict] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    stopped_early: bool = False

    def note(self, event: Event, where: str, found: list[str]) -> None:
        self.differences.append({"packet": event.index, "what": event.what,
                                 "port": event.port, "frame": event.wire().hex(),
                                 "where": where, "found": found})

    @property
    def clean(self) -> bool:
        return not any(self.against_expected.values()) and not self.between_targets


def run(targets: list, events: list[Event], seed: int) -> Report:
    """Each event into every target in turn; each observation compared with the expectation
    and with the first target's."""
    report = Report(seed=seed, targets=[t.name for t in targets])
    report.against_expected = {t.name: 0 for t in targets}
    differing = 0
    for event in events:
        if differing >= MAX_REPORTED:
            report.stopped_early = True
            break
        report.packets += 1
        report.kinds[event.kind] = report.kinds.get(event.kind, 0) + 1
        wanted = Observation.expected(event.expect)
        seen = []
        differs = False
        for target in targets:
            observed = target.run(event, event.expect)
            seen.append(observed)
            found = wanted.differences(observed)
            if found:
                differs = True
                report.against_expected[target.name] += 1
                report.note(event, f"{target.name} vs expected", found)
        for target, observed in zip(targets[1:], seen[1:], strict=True):
            found = seen[0].differences(observed)
            if found:
                differs = True
                report.between_targets += 1
                report.note(event, f"{targets[0].name} vs {target.name}", found)
        differing += differs
    for target in targets:
        if isinstance(target, VethTarget):
            late = target.drain(0.3)
            if late:
                report.against_expected[target.name] += 1
                report.differences.append({"where": target.name, "found": [
                    f"late frame on port {p}: {f.hex()}" for p, f in late]})
    return report


# ---------------------------------------------------------------------------- the testbed
class DualTestbed(kit_targets.DualTestbed):
    """Both targets (or, without ``bmv2``, the software target alone) on the scenario's
    ports, in a namespace of their own; ``drive`` runs the sequence there."""

    def __init__(self, namespace: str, log_dir: Path, bmv2: str | None) -> None:
        super().__init__(namespace, log_dir, bmv2, PORTS)

    def drive(self, seed: int, packets: int, timeout: float = 1800) -> Report:
        """Run the driver inside the namespace; its JSON report."""
        out = self.run_driver(["-m", "tests.diffrun", "drive", "--seed", str(seed),
                               "--packets", str(packets), "--targets",
                               ",".join(self.targets)], timeout)
        return Report(**json.loads(out.strip().splitlines()[-1]))


def drive(seed: int, packets: int, names: list[str]) -> Report:
    """Inside the namespace: the targets, the sequence, the report."""
    where = {"soft": (SOFT_GRPC, "a"), "bmv2": (BMV2_GRPC, "c")}
    targets = []
    try:
        for name in names:
            targets.append(VethTarget(name, *where[name], PORTS, configure))
        return run(targets, generate(seed, packets), seed)
    finally:
        for target in targets:
            target.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.diffrun", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=("drive",), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--packets", type=int, default=2000)
    parser.add_argument("--in-process", action="store_true",
                        help="the software target alone, against the expectations")
    parser.add_argument("--soft-only", action="store_true",
                        help="the software target's process on veths alone (no BMv2 needed)")
    parser.add_argument("--targets", default="soft,bmv2", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", type=Path, default=Path("results/diffrun"))
    args = parser.parse_args(argv)
    if args.mode == "drive":
        report = drive(args.seed, args.packets, args.targets.split(","))
        print(json.dumps(report.__dict__))
        return 0 if report.clean else 1
    if args.in_process:
        with InProcessTarget() as target:
            report = run([target], generate(args.seed, args.packets), args.seed)
    else:
        from emulation.net import BMV2_MISSING, find_bmv2
        from emulation.testbed import have_netns

        bmv2 = None if args.soft_only else find_bmv2()
        reason = have_netns() or (None if bmv2 or args.soft_only else BMV2_MISSING)
        if reason:
            print(f"diffrun: {reason}", file=sys.stderr)
            return 2
        args.log_dir.mkdir(parents=True, exist_ok=True)
        testbed = DualTestbed(f"td{os.getpid()}", args.log_dir, bmv2)
        try:
            report = testbed.drive(args.seed, args.packets)
        finally:
            testbed.close()
    print(json.dumps(report.__dict__, indent=1))
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
