"""Switches for a test to run packets through: the software target's pipeline in this process,
a switch process (software target or simple_switch_grpc) reached through veths, both side by
side in a namespace of their own, or a whole emulation. Each is configured over P4Runtime by
the control plane's own code, as a deployment would be.

``InProcessTarget`` and ``VethTarget`` run one ``tests.kit.oracle.Event`` at a time and report
what it did as an ``Observation``, for the differential test.
"""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bml.protocol import CPU_PORT
from control_plane.p4info import Names, built_p4info
from control_plane.session import SwitchSession, entry
from emulation.testbed import in_namespace, start_switch
from tests.kit import namespaces
from tests.kit.counters import Counters, read_pipeline, read_session
from tests.kit.oracle import Event, Expect, Observation

SOFT_GRPC, BMV2_GRPC = "127.0.0.1:9559", "127.0.0.1:9560"
COUNTER_WAIT = 5.0  # liveness bounds only: a correct target answers in milliseconds
FRAME_WAIT = 3.0
NOTHING_WAIT = 0.2
SETTLE_WAIT = 1.0

Configure = Callable[[SwitchSession], None]


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


class InProcessSwitch:
    """The software target's pipeline in this process behind its own P4Runtime server on
    loopback, and a session to it: configured as a real switch is, without root or veths.
    Frames the server sends out (PacketOuts) collect in ``sent``."""

    def __init__(self, name: str, timeout: float = 5.0,
                 election_id: tuple[int, int] = (0, 1)) -> None:
        from soft_target.p4runtime_server import SoftP4RuntimeServicer, serve
        from soft_target.pipeline import Pipeline

        self.pipeline = Pipeline()
        self.sent: list[tuple[int, bytes]] = []
        self.servicer = SoftP4RuntimeServicer(self.pipeline, 1, lambda task: task(),
                                              self.sent.extend)
        self.server, port = serve(self.servicer, "127.0.0.1:0")
        self.session: SwitchSession | None = None
        try:
            self.session = SwitchSession(name, f"127.0.0.1:{port}", 1, election_id,
                                         timeout=timeout)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.server.stop(0)


class InProcessTarget(InProcessSwitch):
    """The differential test's in-process target: packets go straight into
    ``Pipeline.process``, PacketOuts through the P4Runtime server's own handling."""

    name = "soft-in-process"

    def __init__(self, configure: Configure) -> None:
        super().__init__("soft")
        try:
            configure(self.session)
        except BaseException:
            self.close()
            raise

    def counters(self) -> Counters:
        return read_pipeline(self.pipeline)

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

    def __enter__(self) -> InProcessTarget:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class VethTarget:
    """A switch process reached through veths (its port N's peer is ``<prefix>N``) and
    P4Runtime."""

    def __init__(self, name: str, address: str, prefix: str, ports: tuple[int, ...],
                 configure: Configure) -> None:
        from soft_target.switch import open_port

        self.name = name
        self.session = SwitchSession(name, address, 1, (0, 1), timeout=10)
        self.sockets: dict[int, socket.socket] = {}
        try:
            configure(self.session)
            self.sockets = {port: open_port(f"{prefix}{port}") for port in ports}
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
        return read_session(self.session)

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


class DualTestbed:
    """The software target and simple_switch_grpc side by side in one namespace of their
    own, ports each on veth pairs (sN/aN and bN/cN, P4Runtime on ``SOFT_GRPC`` and
    ``BMV2_GRPC``); without ``bmv2`` the software target alone. A driver run inside the
    namespace (``run_driver``) reaches them on aN and cN."""

    def __init__(self, namespace: str, log_dir: Path, bmv2: str | None,
                 ports: tuple[int, ...]) -> None:
        self.namespace = namespace
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen] = []
        try:
            namespaces.fresh_namespace(namespace)
            self.targets = ["soft", "bmv2"] if bmv2 else ["soft"]
            for port in ports:
                for switch_side, host_side in (("s", "a"), ("b", "c"))[:len(self.targets)]:
                    namespaces.add_veth(namespace, f"{switch_side}{port}", f"{host_side}{port}")
            soft = [a for p in ports for a in ("-i", f"{p}@s{p}")]
            hard = [a for p in ports for a in ("-i", f"{p}@b{p}")]
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

    def run_driver(self, arguments: list[str], timeout: float) -> str:
        """``python <arguments>`` inside the namespace; its standard output (exit 0 or 1:
        a verdict; anything else raises). Its output is kept in ``driver.out``."""
        done = in_namespace(self.namespace, sys.executable, *arguments, check=False,
                            timeout=timeout)
        (self.log_dir / "driver.out").write_text(done.stdout + done.stderr)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"driver failed (exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout

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
        namespaces.delete_namespace(self.namespace)


@contextmanager
def emulation(name: str, spec: str, target: str, bmv2: str | None) -> Iterator:
    """An emulation of ``spec`` on ``target`` switches (``emulation.net``), named ``name``
    (one left by an earlier run taken down first), taken down at the end."""
    from emulation import net

    net.down(name)
    state = net.up(name, spec, target, bmv2=bmv2)
    try:
        yield state
    finally:
        net.down(name)
