"""``bml-switch``: the software target as a process, with the command line of simple_switch_grpc.

Ports are AF_PACKET sockets on real interfaces (veths), so the packets the emulation sends are
real frames on real links. One thread owns the pipeline and runs the packet loop; gRPC threads
hand it work through ``run_in_loop``. The hot path is plain sockets, ``struct`` and numpy, and
frames move in batches: per wake-up, one recvmmsg per ready port (``bml.sockets``), the batch
through the pipeline at once (``Pipeline.process_batch``), and the copies it makes leave in
one sendmmsg per egress port.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import queue
import select
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable

import numpy as np

from bml.sockets import (
    BATCHED_IO,
    FRAME_BUFFER,
    QUEUE_FULL,
    BatchReceiver,
    BatchSender,
    force_buffers,
)
from soft_target.batch import Copies, FrameBatch
from soft_target.p4runtime_server import SoftP4RuntimeServicer, serve
from soft_target.pipeline import BATCH_LEAST, Pipeline

log = logging.getLogger("bml-switch")
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
ETH_P_8021Q = 0x8100
_AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata
_AUXDATA_SPACE = socket.CMSG_SPACE(_AUXDATA.size)
# A port's one control message per frame, read where the batch receiver's control ring holds
# it (``bml.sockets.BatchReceiver``): struct cmsghdr, then struct tpacket_auxdata.
_AUX_MESSAGE = struct.Struct("@Nii" + _AUXDATA.format.lstrip("=@"))
assert _AUX_MESSAGE.size <= _AUXDATA_SPACE and struct.calcsize("@Nii") == socket.CMSG_LEN(0)
SOCKET_BUFFER = 8 << 20
MAX_FRAME = FRAME_BUFFER  # an MTU-sized packet, its Ethernet header and a VLAN tag
PORT_BATCH = 64  # frames taken from one port per wake-up: a bounded burst keeps ports fair
# What a port's socket may refuse a frame for without the switch failing: the link is full
# (the frame is lost, as on a congested link), or the interface is gone or down.
_TX_LOST = QUEUE_FULL | {errno.ENETDOWN, errno.ENXIO}


def open_port(interface: str) -> socket.socket:
    """A raw socket on ``interface`` that sees only frames arriving from the link, with the
    VLAN tag the kernel may strip reported beside each frame (see ``receive_frame``)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    force_buffers(sock, SOCKET_BUFFER)
    sock.bind((interface, 0))
    sock.setblocking(False)
    return sock


def receive_frame(sock: socket.socket, buffer: bytearray) -> bytes:
    """One frame as it was on the wire. With VLAN offload (veths have it) the kernel takes an
    802.1Q tag out of the frame and reports it beside; it goes back in here, as libpcap does
    for BMv2, or the pipeline would look inside a tagged frame that BMv2 never parses."""
    size, ancillary, _flags, _address = sock.recvmsg_into([buffer], _AUXDATA_SPACE)
    return as_on_wire(memoryview(buffer)[:size], ancillary)


def as_on_wire(frame: memoryview, ancillary: list[tuple[int, int, bytes]]) -> bytes:
    """A copy of a received ``frame`` with the VLAN tag its ``ancillary`` data (the socket's
    PACKET_AUXDATA) report put back in after the MAC addresses (see ``receive_frame``)."""
    for level, kind, data in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA:
            return with_vlan_tag(frame, data)
    return bytes(frame)


def with_vlan_tag(frame: memoryview, auxdata: bytes | memoryview | None) -> bytes:
    """A copy of ``frame``, with the VLAN tag that ``auxdata`` (its struct tpacket_auxdata,
    if any) reports the kernel took out put back in."""
    if auxdata is not None and len(auxdata) >= _AUXDATA.size:
        status, _len, _snap, _mac, _net, tci, tpid = _AUXDATA.unpack_from(auxdata)
        if status & TP_STATUS_VLAN_VALID or tci:
            return _tagged(frame, status, tci, tpid)
    return bytes(frame)


def from_control_ring(frame: memoryview, control: bytearray, at: int) -> bytes:
    """``with_vlan_tag`` for a frame of a batch: its PACKET_AUXDATA read where the batch
    receiver's control ring holds it (``control[at:]``), with one ``struct`` call."""
    (_, level, kind, status, _, _, _, _, tci, tpid) = _AUX_MESSAGE.unpack_from(control, at)
    if level == SOL_PACKET and kind == PACKET_AUXDATA and (status & TP_STATUS_VLAN_VALID or tci):
        return _tagged(frame, status, tci, tpid)
    return bytes(frame)


# The same, for a whole batch at once: each frame's control message as a record (all zero
# where none came). The ports' sockets ask for no other control message.
_AUX_RING = np.dtype({"names": ["status", "tci"], "formats": ["=u4", "=u2"],
                      "offsets": [struct.calcsize("@Nii"), struct.calcsize("@Nii") + 16],
                      "itemsize": _AUXDATA_SPACE})


def _tagged_any(auxdata: np.ndarray) -> bool:
    """Whether any frame of a batch (its ``_AUX_RING`` records) had a VLAN tag taken out."""
    return bool(((auxdata["status"] & TP_STATUS_VLAN_VALID) | auxdata["tci"]).any())


def _tagged(frame: memoryview, status: int, tci: int, tpid: int) -> bytes:
    if not status & TP_STATUS_VLAN_TPID_VALID:
        tpid = ETH_P_8021Q
    return b"".join((frame[:12], struct.pack("!HH", tpid, tci), frame[12:]))


class SoftSwitch:
    """The packet loop: frames in from the ports, through the pipeline, copies out."""

    def __init__(self, ports: dict[int, str], device_id: int) -> None:
        self.pipeline = Pipeline()
        self.sockets = {number: open_port(name) for number, name in ports.items()}
        self.port_of_fd = {sock.fileno(): number for number, sock in self.sockets.items()}
        self.tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.stopping = threading.Event()
        self.tx_errors = 0  # frames a port's socket refused (full or down): lost
        self.sender = BatchSender(PORT_BATCH, MAX_FRAME)
        self.servicer = SoftP4RuntimeServicer(self.pipeline, device_id, self.run_in_loop,
                                              self.transmit)

    def run_in_loop(self, task: Callable[[], None]) -> None:
        self.tasks.put(task)
        os.write(self.wake_w, b"x")

    def transmit(self, copies: list[tuple[int, bytes]] | Copies) -> None:
        """Send pipeline output, (egress port, frame) each, in one sendmmsg per port (and
        per run of a result block's rows)."""
        if type(copies) is list:
            by_port: dict[int, list] = {}
            for port, frame in copies:
                frames = by_port.get(port)
                if frames is None:
                    by_port[port] = [[frame]]
                else:
                    frames[0].append(frame)
        else:
            by_port = copies.by_port()
        sockets, send, send_rows = self.sockets, self.sender.send, self.sender.send_rows
        for port, runs in by_port.items():
            sock = sockets.get(port)
            if sock is None:
                continue  # no such port: the frame leaves nowhere, as in BMv2
            for frames in runs:
                self._send_run(sock, send if type(frames) is list else send_rows, frames)

    def _send_run(self, sock: socket.socket, send: Callable, frames) -> None:
        """Send a port's frames in order; a frame its port refuses for a full queue (or a
        link that is down) is lost, as on a congested link: counted in ``tx_errors``."""
        start = 0
        while start < len(frames):
            sent, err = send(sock, frames[start:] if start else frames)
            if not err:
                return
            if err not in _TX_LOST:
                raise OSError(err, os.strerror(err))
            # One refused frame is lost; the rest are tried (the queue may have room for
            # the smaller ones, as it would have frame by frame).
            self.tx_errors += 1
            start += sent + 1

    def run(self) -> None:
        poller = select.epoll()
        poller.register(self.wake_r, select.EPOLLIN)
        for fd in self.port_of_fd:
            poller.register(fd, select.EPOLLIN)
        receiver = BatchReceiver(PORT_BATCH, MAX_FRAME, _AUXDATA_SPACE)
        ring, control = memoryview(receiver.buffer), receiver.control_buffer
        auxdata = np.frombuffer(control, _AUX_RING)
        # A batch of fewer frames goes through the pipeline frame by frame, as it would there
        # (``Pipeline.process_batch``), without the rows' fixed cost; and every batch does
        # with I/O unbatched (``BML_BATCHED_IO=0``, the benchmarks' baseline).
        least = BATCH_LEAST if BATCHED_IO else PORT_BATCH + 1
        pipeline = self.pipeline
        port_of_fd = self.port_of_fd
        sockets = self.sockets
        while not self.stopping.is_set():
            for fd, _ in poller.poll(0.2):
                if fd == self.wake_r:
                    self._run_tasks()
                    continue
                port = port_of_fd[fd]
                try:  # one batch per port per wake-up: fair
                    lengths = receiver.receive_rows(sockets[port])
                except OSError as exc:
                    if exc.errno == errno.ENETDOWN:
                        continue
                    raise
                count = len(lengths)
                if not count:
                    continue
                if count < least or _tagged_any(auxdata[:count]):
                    frames = [from_control_ring(  # as on the wire: a tag put back in
                        ring[i * MAX_FRAME:i * MAX_FRAME + size], control, i * _AUXDATA_SPACE)
                        for i, size in enumerate(lengths.tolist())]
                    if count < least:
                        self.transmit([copy for frame in frames
                                       for copy in pipeline.process(port, frame)])
                        continue
                    batch = FrameBatch.of(frames)
                else:
                    batch = FrameBatch(receiver.rows[:count], lengths)
                self.transmit(pipeline.process_batch(port, batch))

    def _run_tasks(self) -> None:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        while True:
            try:
                task = self.tasks.get_nowait()
            except queue.Empty:
                return
            task()


def parse_interface(text: str) -> tuple[int, str]:
    number, _, name = text.partition("@")
    if not name or not number.isdigit():
        raise argparse.ArgumentTypeError(f"expected PORT@INTERFACE, got {text!r}")
    return int(number), name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bml-switch",
        description="BML-INA software target: the p4src pipeline in Python, served over "
                    "P4Runtime, on real interfaces.")
    parser.add_argument("-i", "--interface", action="append", type=parse_interface, default=[],
                        metavar="PORT@IFACE", help="attach port number PORT to IFACE")
    parser.add_argument("--device-id", type=int, default=1)
    parser.add_argument("--grpc-server-addr", default="127.0.0.1:9559")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(name)s: %(message)s")
    ports = dict(args.interface)
    if len(ports) != len(args.interface):
        parser.error("a port number is given twice")
    try:
        switch = SoftSwitch(ports, args.device_id)
    except OSError as exc:
        print(f"bml-switch: cannot open ports {ports}: {exc}", file=sys.stderr)
        return 2
    try:
        server, _ = serve(switch.servicer, args.grpc_server_addr)
    except OSError as exc:
        print(f"bml-switch: {exc}", file=sys.stderr)
        return 2

    def stop(*_: object) -> None:
        switch.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"bml-switch: device {args.device_id}, ports {ports}, P4Runtime on "
          f"{args.grpc_server_addr}", flush=True)
    try:
        switch.run()
    finally:
        server.stop(grace=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
