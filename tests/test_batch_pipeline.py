"""``Pipeline.process_batch`` is ``Pipeline.process`` frame after frame: the same copies in the
same order, the same registers and counters, whatever a batch holds. Two pipelines, configured
alike by the control plane, take the same frames: one a frame at a time, one in the batches a
switch port would bring. The traffic, at the default width and the widest, is a star's calls
with what goes wrong on links mixed in (losses, re-sends, probes, late and stale copies, a
newer call, older calls, forged and broken frames); and the differential test's sequence
(every kind of packet) grouped by port. Then the switch process's loop on veths against the
same reference: what leaves each port, frame for frame."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time

import numpy as np
import pytest

from bml.frames import (
    SWITCH_IP,
    SWITCH_MAC,
    aggregation_frame,
    host_ip,
    host_mac,
    probe_frame,
    udp_frame,
)
from bml.protocol import (
    CPU_PORT,
    DEFAULT_LANES,
    PRIMING_OFFSET,
    WIDEST_LANES,
    PacketType,
    ResultMode,
    Stat,
    wire,
)
from bml.sockets import FRAME_BUFFER, BatchSender
from bml.topology import Switch
from control_plane.egress_rewrite import host_address_entry
from control_plane.jobs import AggregationGroup
from control_plane.p4info import built_p4info
from control_plane.provision import install_group
from control_plane.session import SwitchSession
from emulation.testbed import have_netns
from soft_target.batch import FrameBatch
from soft_target.p4runtime_server import SoftP4RuntimeServicer, serve
from soft_target.pipeline import Pipeline
from soft_target.switch import SoftSwitch
from tests.diffgen import generate
from tests.diffrun import configure as configure_scenario
from tests.kit.namespaces import (
    add_veth,
    delete_namespace,
    fresh_namespace,
    in_netns,
    receive_socket,
    send_socket,
)
from tests.kit.targets import InProcessTarget, packet_out, write_l2_default

NETNS_REASON = have_netns()
PORTS = tuple(range(1, 9))
ADDRESSED = PORTS[:-1]  # port 8 has no host address: copies to it are counted, not sent
STAR = AggregationGroup("dut", 41, {0: 1, 1: 2, 2: 3, 3: 4}, ResultMode.MULTICAST, 0, 32)
# sparse worker ids (31: the bitmap's top bit), one worker behind the unaddressed port
OWNED = AggregationGroup("dut", 42, {0: 5, 31: 6, 2: 8}, ResultMode.TO_OWNER, 32, 16)
GROUPS = (STAR, OWNED)


def configure_jobs(session) -> None:
    session.push_pipeline()
    session.write_entries([host_address_entry(p, host_mac(p), host_ip(p), SWITCH_MAC,
                                              SWITCH_IP) for p in ADDRESSED])
    for group in GROUPS:
        install_group(session, Switch("dut", 0, 0, 1, PORTS), group)


def configured(lanes: int) -> Pipeline:
    """A pipeline of ``lanes`` set up with ``GROUPS`` by the control plane, over P4Runtime."""
    pipeline = Pipeline(lanes=lanes)
    server, port = serve(SoftP4RuntimeServicer(pipeline, 1, lambda task: task(),
                                               lambda copies: None), "127.0.0.1:0")
    try:
        session = SwitchSession("dut", f"127.0.0.1:{port}", p4info=built_p4info(lanes))
        try:
            configure_jobs(session)
        finally:
            session.close()
    finally:
        server.stop(0)
    return pipeline


def assert_same_state(a: Pipeline, b: Pipeline) -> None:
    assert a.stats == b.stats
    assert a.drops == b.drops
    assert a.unaddressed == b.unaddressed
    for name in ("worker_bitmap", "contributions", "max_exponent", "chunk_offset",
                 "copy_generation", "job_generation"):
        assert getattr(a, name) == getattr(b, name), name
    assert np.array_equal(a.sums, b.sums)


def as_in_a_ring(frames: list[bytes]) -> FrameBatch:
    """``frames`` as a switch port's receive ring holds them: rows of the largest frame's
    size, each holding an earlier frame's bytes past its own end."""
    rows = np.frombuffer(RNG_BYTES[:len(frames) * FRAME_BUFFER], np.uint8).reshape(
        len(frames), FRAME_BUFFER).copy()
    for row, frame in zip(rows, frames, strict=True):
        row[:len(frame)] = np.frombuffer(frame, np.uint8)
    return FrameBatch(rows, np.array([len(f) for f in frames], np.int64))


RNG_BYTES = random.Random(0).randbytes(64 * FRAME_BUFFER)


def send(frame_by_frame: Pipeline, batched: Pipeline, port: int, frames: list[bytes]) -> None:
    """``frames`` from ``port`` into both: the same copies, in the same order, and each
    egress port's in the same order as the switch sends them (``Copies.by_port``)."""
    expected = [c for frame in frames for c in frame_by_frame.process(port, frame)]
    copies = batched.process_batch(port, as_in_a_ring(frames))
    assert list(copies) == expected
    by_port: dict[int, list[bytes]] = {}
    for out_port, frame in expected:
        by_port.setdefault(out_port, []).append(frame)
    assert {out_port: [bytes(frame) for run in runs for frame in run]
            for out_port, runs in copies.by_port().items()} == by_port


class StarCalls:
    """What the star's four workers (and the owned job's three) send, use after use of every
    slot, with faults drawn from ``rng``: each port's frames of a use as one list."""

    def __init__(self, rng: random.Random, lanes: int) -> None:
        self.rng = rng
        self.lanes = lanes
        self.generation = {STAR.job_id: 1, OWNED.job_id: 1}
        self.sent: list[tuple[int, bytes]] = []  # (port, frame) sent so far: to re-send

    def frame(self, group: AggregationGroup, worker: int, slot: int, use: int,
              generation: int | None = None, ptype: int = PacketType.DATA) -> bytes:
        rng = self.rng
        port = group.members[worker]
        offset = (use * group.pool_size + slot) * 64 % PRIMING_OFFSET
        if generation is None:
            generation = self.generation[group.job_id]
        if ptype == PacketType.PROBE:
            return probe_frame(port, group.job_id, worker, slot, use & 1, offset,
                               generation=generation, count=wire(self.lanes).blocks)
        owner = rng.choice(list(group.members))
        lanes = self.lanes
        values = rng.choice([np.full(lanes, rng.randrange(-2**31, 2**31), np.int64),
                             np.arange(lanes, dtype=np.int64) * rng.randrange(1, 2**20)])
        return aggregation_frame(port, group.job_id, worker, slot, use & 1, offset, values,
                                 exponent=rng.randrange(0, 256), owner=owner,
                                 ident=rng.randrange(1 << 16), tos=rng.randrange(256),
                                 generation=generation)

    def use(self, group: AggregationGroup, use: int) -> dict[int, list[bytes]]:
        rng = self.rng
        if rng.random() < 0.1:  # a newer call
            self.generation[group.job_id] = (self.generation[group.job_id] + 1) & 0xFFFF
        by_port: dict[int, list[bytes]] = {}
        for worker, port in group.members.items():
            frames = []
            for slot in range(group.pool_size):
                if rng.random() < 0.05:
                    continue  # lost on the link
                frames.append(self.frame(group, worker, slot, use))
                draw = rng.random()
                if draw < 0.03:
                    frames.append(frames[-1])  # re-sent
                elif draw < 0.05:
                    frames.append(self.frame(group, worker, slot, use, ptype=PacketType.PROBE))
                elif draw < 0.06:
                    frames.append(self.frame(group, worker, slot, use,
                                             generation=self.generation[group.job_id] - 1))
                elif draw < 0.07 and self.sent:
                    frames.append(rng.choice(self.sent)[1])  # late, or from another port
                elif draw < 0.08:
                    frames.append(frames[-1][:-4])  # cut short
                elif draw < 0.09:
                    frames.append(udp_frame(SWITCH_MAC, host_mac(port), host_ip(port),
                                            SWITCH_IP, 4000, 4001, b"ordinary"))
            if rng.random() < 0.3:
                rng.shuffle(frames)
            self.sent += [(port, f) for f in frames[:4]]
            by_port[port] = frames
        return by_port


def batches(rng: random.Random, frames: list[bytes]) -> list[list[bytes]]:
    """``frames`` cut as recvmmsg would hand them over: up to 64 at a time."""
    out, at = [], 0
    while at < len(frames):
        size = rng.choice([1, 3, 8, 17, 64, 64])
        out.append(frames[at:at + size])
        at += size
    return out


@pytest.mark.parametrize(("lanes", "seed"), [(DEFAULT_LANES, 1), (DEFAULT_LANES, 2),
                                             (DEFAULT_LANES, 3), (WIDEST_LANES, 4)])
def test_star_calls_with_faults_batched_as_frame_by_frame(lanes, seed):
    rng = random.Random(seed)
    frame_by_frame, batched = configured(lanes), configured(lanes)
    calls = StarCalls(rng, lanes)
    for use in range(24 if lanes == DEFAULT_LANES else 6):
        for group in GROUPS:
            for port, frames in calls.use(group, use).items():
                for batch in batches(rng, frames):
                    send(frame_by_frame, batched, port, batch)
    assert_same_state(frame_by_frame, batched)
    # What this test is for: most contributions took the batch path, and results left.
    assert batched.batched > 3 * batched.stats[Stat.AGGREGATED] // 4
    assert batched.stats[Stat.COMPLETED] > 20


@pytest.mark.parametrize("seed", [4, 5])
def test_differential_sequence_by_port_batched_as_frame_by_frame(seed):
    """Every kind of packet the differential test makes, each port's frames between two
    controller actions sent as one batch."""
    rng = random.Random(seed)
    with InProcessTarget(configure_scenario) as one, InProcessTarget(configure_scenario) as other:
        pending: dict[int, list[bytes]] = {}

        def flush() -> None:
            for port, frames in pending.items():
                for batch in batches(rng, frames):
                    send(one.pipeline, other.pipeline, port, batch)
            pending.clear()

        for event in generate(seed, 1500):
            if event.control or event.port == CPU_PORT:
                flush()
                for target in (one, other):
                    if event.control:
                        write_l2_default(target.session, event.l2_default)
                    else:
                        target.sent.clear()
                        target.servicer._packet_out(packet_out(event))
                assert other.sent == one.sent
                continue
            pending.setdefault(event.port, []).append(event.frame)
            if rng.random() < 0.05:
                flush()
        flush()
        assert_same_state(one.pipeline, other.pipeline)


def tagged(frame: bytes, vlan: int) -> bytes:
    """``frame`` with an 802.1Q tag after its MAC addresses."""
    return frame[:12] + (0x8100).to_bytes(2, "big") + vlan.to_bytes(2, "big") + frame[12:]


def frames_out(receivers: dict, expected: dict[int, list[bytes]]) -> dict[int, list[bytes]]:
    """What arrives on each port's receiver: as many frames as ``expected`` has for it (fewer
    if they do not come within 5 s), and any more that come within 50 ms after."""
    deadline = time.monotonic() + 5
    got: dict[int, list[bytes]] = {port: [] for port in receivers}
    for port, sock in receivers.items():
        while len(got[port]) < len(expected[port]) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                got[port].append(sock.recv(FRAME_BUFFER))
    time.sleep(0.05)
    for port, sock in receivers.items():
        sock.setblocking(False)
        try:
            while True:
                got[port].append(sock.recv(FRAME_BUFFER))
        except BlockingIOError:
            pass
        finally:
            sock.settimeout(0.2)
    return got


@pytest.mark.netns
@pytest.mark.skipif(NETNS_REASON is not None, reason=str(NETNS_REASON))
def test_switch_process_loop_on_veths_leaves_what_the_pipeline_makes():
    """The switch's packet loop (``SoftSwitch.run``) on veths, each port's frames of a use
    sent as one burst: every port gets exactly the frames, in the order, that a pipeline
    configured alike makes of them one by one. Bursts of contributions (taken as rows of the
    port's receive ring), bursts with a VLAN-tagged frame in them (the tag the kernel takes
    out put back), and the faults of ``StarCalls``."""
    namespace = f"bmlbp{os.getpid()}"
    fresh_namespace(namespace)
    sockets: list = []
    try:
        for port in PORTS:
            add_veth(namespace, f"p{port}", f"t{port}")
        switch = in_netns(namespace, lambda: SoftSwitch({p: f"p{p}" for p in PORTS}, 1))
        server, grpc_port = serve(switch.servicer, "127.0.0.1:0")
        loop = threading.Thread(target=switch.run, name="switch loop", daemon=True)
        loop.start()
        try:
            session = SwitchSession("dut", f"127.0.0.1:{grpc_port}",
                                    p4info=built_p4info(DEFAULT_LANES))
            try:
                configure_jobs(session)
            finally:
                session.close()
            reference = configured(DEFAULT_LANES)
            senders = {p: send_socket(namespace, f"t{p}") for p in PORTS}
            receivers = {p: receive_socket(namespace, f"t{p}") for p in PORTS}
            sockets += [*senders.values(), *receivers.values()]
            rng = random.Random(7)
            calls = StarCalls(rng, DEFAULT_LANES)
            for use in range(8):
                for port, frames in calls.use(STAR, use).items():
                    if use % 2 and frames:  # a contribution with a tag: not BML (BmlParser)
                        frames.insert(rng.randrange(len(frames)),
                                      tagged(rng.choice(frames), use))
                    expected: dict[int, list[bytes]] = {p: [] for p in PORTS}
                    for frame in frames:
                        for out_port, copy in reference.process(port, frame):
                            expected[out_port].append(copy)
                    assert BatchSender().send(senders[port], frames) == (len(frames), 0)
                    assert frames_out(receivers, expected) == expected, \
                        f"use {use}, frames from port {port}"
            # What this test is for: contributions went through the batch path.
            assert switch.pipeline.batched > switch.pipeline.stats[Stat.AGGREGATED] // 2
            assert (switch.pipeline.stats, switch.pipeline.drops) == (reference.stats,
                                                                      reference.drops)
        finally:
            switch.stopping.set()
            loop.join(5)
            server.stop(0)
            sockets += switch.sockets.values()
    finally:
        for sock in sockets:
            sock.close()
        delete_namespace(namespace)
