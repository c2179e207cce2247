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
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bml.protocol import CPU_PORT, DROPS_SIZE, STATS_SIZE, DropReason, Stat
from bml.topology import Switch
from control_plane.p4info import Names, built_p4info
from control_plane.provision import install_group
from control_plane.session import SwitchSession, entry
from emulation.testbed import in_namespace, start_switch
from tests.diffgen import JOBS, PORTS, Event, Expect, generate, table_entries

SOFT_GRPC, BMV2_GRPC = "127.0.0.1:9559", "127.0.0.1:9560"
COUNTER_WAIT = 5.0  # liveness bounds only: a correct target answers in milliseconds
FRAME_WAIT = 3.0
NOTHING_WAIT = 0.2
SETTLE_WAIT = 1.0
MAX_REPORTED = 20  # differing packets reported; the run stops there (a wrong target is slow)


@dataclass
class Observation:
    """What one packet did on one target: counter increments and the frames that left."""

    stats: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    unaddressed: int = 0
    outputs: list[tuple[int, str]] = field(default_factory=list)  # (port, hex), sorted

    @classmethod
    def expected(cls, expect: Expect) -> Observation:
        return cls({Stat(s).name: n for s, n in expect.stats.items() if n},
                   {DropReason(d).name: n for d, n in expect.drops.items() if n},
                   expect.unaddressed, sorted((p, f.hex()) for p, f in expect.outputs))

    @classmethod
    def of(cls, before: Counters, after: Counters,
           outputs: list[tuple[int, bytes]]) -> Observation:
        stats = {Stat(i).name: a - b for i, (b, a) in enumerate(zip(before.stats, after.stats,
                                                                   strict=True))
                 if a != b and i in Stat._value2member_map_}
        drops = {DropReason(i).name: a - b for i, (b, a) in
                 enumerate(zip(before.drops, after.drops, strict=True))
                 if a != b and i in DropReason._value2member_map_}
        return cls(stats, drops, after.unaddressed - before.unaddressed,
                   sorted((p, f.hex()) for p, f in outputs))

    def differences(self, other: Observation) -> list[str]:
        """What differs, in words (``self`` is the reference)."""
        found = []
        for name in ("stats", "drops", "unaddressed"):
            if getattr(self, name) != getattr(other, name):
                found.append(f"{name}: {getattr(self, name)} vs {getattr(other, name)}")
        if self.outputs != other.outputs:
            mine, theirs = Counter(self.outputs), Counter(other.outputs)
            found += [f"missing on port {p}: {f}" for p, f in (mine - theirs).elements()]
            found += [f"extra on port {p}: {f}" for p, f in (theirs - mine).elements()]
        return found


@dataclass
class Counters:
    stats: list[int]
    drops: list[int]
    unaddressed: int

    def total(self) -> int:
        return sum(self.stats) + sum(self.drops)


def configure(session: SwitchSession) -> None:
    """The scenario through the control plane: pipeline, addresses, routes, jobs."""
    session.push_pipeline()
    session.write_entries(table_entries())
    for job in JOBS:
        install_group(session, _SWITCH, job.group)


def packet_out(event: Event):
    """The P4Runtime PacketOut message of a CPU-port event, its magic bytes as they are."""
    from p4.v1 import p4runtime_pb2

    packet = p4runtime_pb2.PacketOut(payload=event.frame)
    metadata_id, _width = built_p4info().packet_out_metadata["magic"]
    packet.metadata.add(metadata_id=metadata_id, value=event.magic_bytes())
    return packet


def write_l2_default(session: SwitchSession, port: int | None) -> None:
    """MODIFY l2_forward's default entry: forward_to(port), or (None) the program's."""
    from p4.v1 import p4runtime_pb2

    request = p4runtime_pb2.WriteRequest()
    update = request.updates.add(type=p4runtime_pb2.Update.MODIFY)
    table_entry = update.entity.table_entry
    table_entry.table_id = session.p4info.table(Names.L2_FORWARD).id
    table_entry.is_default_action = True
    if port is not None:
        table_entry.action.action.CopyFrom(session.table_entry(
            entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": 0}, Names.FORWARD_TO, port=port))
            .action.action)
    session._write(request, [f"l2_forward default entry -> {port}"])


# The switch object the control plane's RESET frames take addresses from (PacketOut frames
# are not forwarded, so which addresses does not matter).
_SWITCH = Switch("dut", 0, 0, 1, PORTS)


# ---------------------------------------------------------------------------- targets
class InProcessTarget:
    """The software target's pipeline in this process, configured over its own P4Runtime
    server on loopback; packets go straight into ``Pipeline.process``."""

    name = "soft-in-process"

    def __init__(self) -> None:
        from soft_target.p4runtime_server import SoftP4RuntimeServicer, serve
        from soft_target.pipeline import Pipeline

        self.pipeline = Pipeline()
        self.sent: list[tuple[int, bytes]] = []
        self.servicer = servicer = SoftP4RuntimeServicer(self.pipeline, 1, lambda task: task(),
                                                         self.sent.extend)
        self.server, port = serve(servicer, "127.0.0.1:0")
        try:
            self.session = SwitchSession("soft", f"127.0.0.1:{port}", 1, (0, 1), timeout=5)
            configure(self.session)
        except BaseException:
            self.close()
            raise

    def counters(self) -> Counters:
        pipeline = self.pipeline
        return Counters(list(pipeline.stats), list(pipeline.drops), pipeline.unaddressed[0])

    def run(self, event: Event, expect: Expect) -> Observation:
        """A port's frame straight into the pipeline; a PacketOut through the P4Runtime
        server's own handling (which may drop it before the pipeline)."""
        if event.control:
            write_l2_default(self.session, event.l2_default)
            return Observation()
        before = self.counters()
        if event.port == CPU_PORT:
            self.sent.clear()
            self.servicer._packet_out(packet_out(event))
            outputs = list(self.sent)
        else:
            outputs = self.pipeline.process(event.port, event.frame)
        return Observation.of(before, self.counters(), outputs)

    def close(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()
        self.server.stop(0)

    def __enter__(self) -> InProcessTarget:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class VethTarget:
    """A switch process reached through veths (its port N's peer is ``<prefix>N``) and
    P4Runtime."""

    def __init__(self, name: str, address: str, prefix: str) -> None:
        from soft_target.switch import open_port

        self.name = name
        self.session = SwitchSession(name, address, 1, (0, 1), timeout=10)
        self.sockets: dict[int, socket.socket] = {}
        try:
            configure(self.session)
            self.sockets = {port: open_port(f"{prefix}{port}") for port in PORTS}
        except BaseException:
            self.close()
            raise
        self.port_of_fd = {sock.fileno(): port for port, sock in self.sockets.items()}
        self.poller = select.poll()
        for fd in self.port_of_fd:
            self.poller.register(fd, select.POLLIN)
        self.buffer = bytearray(9216)
        self.drain(0.2)
        self.last = self.counters()

    def counters(self) -> Counters:
        read = self.session.read_counter
        return Counters(read(Names.STATS)[:STATS_SIZE], read(Names.DROPS)[:DROPS_SIZE],
                        read(Names.UNADDRESSED)[0])

    def packet_out(self, event: Event) -> None:
        """A PacketOut with any magic (SwitchSession.packet_out always sends the right one)."""
        from p4.v1 import p4runtime_pb2

        request = p4runtime_pb2.StreamMessageRequest()
        request.packet.CopyFrom(packet_out(event))
        self.session.client.stream_out_q.put(request)

    def drain(self, quiet: float, want: int = 0, deadline: float = 0.0) -> list[tuple[int,
                                                                                     bytes]]:
        """Frames that come out: at least ``want`` (until ``deadline``), then until none has
        come for ``quiet`` seconds."""
        from soft_target.switch import receive_frame

        frames: list[tuple[int, bytes]] = []
        while True:
            now = time.monotonic()
            wait = quiet if len(frames) >= want or now >= deadline else deadline - now
            ready = self.poller.poll(max(wait, 0) * 1000)
            if not ready:
                if len(frames) >= want or time.monotonic() >= deadline:
                    return frames
                continue
            for fd, _ in ready:
                sock = self.sockets[self.port_of_fd[fd]]
                while True:
                    try:
                        frames.append((self.port_of_fd[fd], receive_frame(sock, self.buffer)))
                    except BlockingIOError:
                        break

    def run(self, event: Event, expect: Expect) -> Observation:
        if event.control:
            write_l2_default(self.session, event.l2_default)
            return Observation()
        before = self.last
        if event.port == CPU_PORT:
            self.packet_out(event)
        else:
            self.sockets[event.port].send(event.frame)
        # Every packet that reaches the pipeline moves a counter (the P4 program counts every
        # path): wait for it. One that must move nothing (a PacketOut P4Runtime drops) gets a
        # short look.
        moves = bool(expect.stats or expect.drops)
        deadline = time.monotonic() + (COUNTER_WAIT if moves else NOTHING_WAIT)
        after = self.counters()
        while after.total() == before.total() and time.monotonic() < deadline:
            time.sleep(0.002)
            after = self.counters()
        outputs = self.drain(0.005, len(expect.outputs), time.monotonic() + FRAME_WAIT)
        # Egress counts (unaddressed) and a multicast's copies settle a little later.
        wanted = Observation.expected(expect)
        deadline = time.monotonic() + SETTLE_WAIT
        observed = Observation.of(before, after, outputs)
        while (observed.stats, observed.drops, observed.unaddressed) != (
                wanted.stats, wanted.drops, wanted.unaddressed) and time.monotonic() < deadline:
            time.sleep(0.01)
            after = self.counters()
            observed = Observation.of(before, after, outputs)
        self.last = after
        return observed

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        self.session.close()


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
class DualTestbed:
    """The software target and simple_switch_grpc side by side in one namespace of their
    own, ports 1..8 each on veth pairs (sN/aN and bN/cN); without ``bmv2`` the software
    target alone (its packet loop on real veths, against the expectations)."""

    def __init__(self, namespace: str, log_dir: Path, bmv2: str | None) -> None:
        self.namespace = namespace
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen] = []
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        subprocess.run(["ip", "netns", "add", namespace], check=True, capture_output=True)
        try:
            for key in ("all", "default"):  # no router solicitations or MLD on the ports
                in_namespace(namespace, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1",
                             check=False)
            in_namespace(namespace, "ip", "link", "set", "lo", "up")
            self.targets = ["soft", "bmv2"] if bmv2 else ["soft"]
            for port in PORTS:
                for switch_side, host_side in (("s", "a"), ("b", "c"))[:len(self.targets)]:
                    in_namespace(namespace, "ip", "link", "add", f"{switch_side}{port}", "type",
                                 "veth", "peer", "name", f"{host_side}{port}")
                    for name in (f"{switch_side}{port}", f"{host_side}{port}"):
                        in_namespace(namespace, "ip", "link", "set", name, "mtu", "9000", "up")
            soft = [a for p in PORTS for a in ("-i", f"{p}@s{p}")]
            hard = [a for p in PORTS for a in ("-i", f"{p}@b{p}")]
            self._start("soft", [sys.executable, "-m", "soft_target.switch", *soft,
                                 "--grpc-server-addr", SOFT_GRPC], SOFT_GRPC)
            if bmv2:
                self._start("bmv2", [bmv2, "--device-id", "1", *hard, "--no-p4", "--",
                                     "--grpc-server-addr", BMV2_GRPC, "--cpu-port",
                                     str(CPU_PORT)], BMV2_GRPC)
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, command: list[str], address: str) -> None:
        log = self.log_dir / f"switch-{name}.log"
        self.processes.append(start_switch(self.namespace, command, address, log, name))

    def drive(self, seed: int, packets: int, timeout: float = 1800) -> Report:
        """Run the driver inside the namespace; its JSON report."""
        done = in_namespace(self.namespace, sys.executable, "-m", "tests.diffrun", "drive",
                            "--seed", str(seed), "--packets", str(packets), "--targets",
                            ",".join(self.targets), check=False,
                            timeout=timeout)
        (self.log_dir / "driver.out").write_text(done.stdout + done.stderr)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"driver failed (exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        return Report(**json.loads(done.stdout.strip().splitlines()[-1]))

    def close(self) -> None:
        from emulation.net import stop_pid

        for process in self.processes:
            # `ip netns exec` execs the command, so this PID is the switch's own.
            stop_pid(process.pid)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.processes = []
        subprocess.run(["ip", "netns", "delete", self.namespace], capture_output=True)


def drive(seed: int, packets: int, names: list[str]) -> Report:
    """Inside the namespace: the targets, the sequence, the report."""
    where = {"soft": (SOFT_GRPC, "a"), "bmv2": (BMV2_GRPC, "c")}
    targets = []
    try:
        for name in names:
            targets.append(VethTarget(name, *where[name]))
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
        import os
        testbed = DualTestbed(f"td{os.getpid()}", args.log_dir, bmv2)
        try:
            report = testbed.drive(args.seed, args.packets)
        finally:
            testbed.close()
    print(json.dumps(report.__dict__, indent=1))
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
