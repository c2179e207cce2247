"""Parameter-server allreduce over TCP: the baseline the seed compares BML against.

Participants 0..W-1 are workers; the gradient is cut into P contiguous shards
(``bml.cost_model.shard_sizes``). Sharded (the default) P = W and worker i also holds shard i;
dedicated, P more participants W..W+P-1 hold the shards and have no gradient. Each worker
pushes shard s to its holder in messages of at most ``PS_CHUNK_VALUES`` values; the holder
adds the W contributions of a chunk up (float64) as they arrive and, once a chunk has all of
them, sends its sum to every worker. The same ranges and message sizes are what the cost
model prices. A message is a 12-byte header and float32 values:

    kind (1) | call (1) | shard (2) | offset in the shard (4) | count (4)

``call`` is the call number mod 256: a participant may start the next call (its pushes)
while another still finishes this one; those messages wait in the inbox for it.

Sockets are non-blocking, driven by one poll loop; the lower-numbered participant of a pair
connects. Addresses default to the star's plan (participant i at 10.1.x.(i+1), eth0).

    python -m baselines.ps run --rank R --world W [--servers P] [--in grad.npy --out sum.npy]
"""

from __future__ import annotations

import argparse
import select
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np

from bml.cost_model import PS_CHUNK_VALUES, PS_HEADER_BYTES, shard_sizes
from bml.sockets import QUEUE_BUDGET, StreamInbox, StreamOutbox, force_buffers, unacked_bytes
from hosts.discovery import nic_counters

HEADER = struct.Struct("!BBHII")
assert HEADER.size == PS_HEADER_BYTES
PUSH, SUM, HELLO = 1, 2, 3
PS_TCP_PORT = 49000
RECV_BYTES = 1 << 18
# Senders pace themselves by their receiver's fan-in: bml.sockets.QUEUE_BUDGET.


class PSError(RuntimeError):
    pass


def star_address(participant: int) -> str:
    """Participant ``i``'s address on a star (bml-net's plan: server i, NIC 0)."""
    return f"10.1.{participant // 250}.{participant % 250 + 1}"


class _Peer:
    """One TCP connection: queued outgoing buffers and the bytes received but not parsed."""

    def __init__(self, index: int, sock: socket.socket, limit: int | None) -> None:
        self.index = index
        self.sock = sock
        self.limit = limit  # bytes it may have unacknowledged in the kernel (None: any)
        self.outbox = StreamOutbox()
        self.inbox = StreamInbox(RECV_BYTES)
        self.closed = False
        self.expected = 0  # messages still to come from this peer in the current call

    def queue(self, *parts: bytes | memoryview) -> None:
        self.outbox.queue(*parts)

    def room(self) -> int:
        """Bytes it may hand to the kernel now."""
        if self.limit is None:
            return 1 << 30
        return self.limit - unacked_bytes(self.sock)

    def flush(self) -> None:
        while self.outbox:
            room = self.room()
            if room <= 0:
                return
            try:
                self.outbox.write(self.sock, room)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise PSError(f"participant {self.index}: {exc}") from None

    def fill(self) -> None:
        """Read what the socket has; EOF marks the peer closed."""
        if not self.inbox.fill(self.sock):
            self.closed = True


class ParameterServer:
    """One participant of a PS allreduce; keep it for many calls (connections stay up)."""

    def __init__(self, rank: int, workers: int, servers: int | None = None,
                 addresses: list[str] | None = None, port: int = PS_TCP_PORT,
                 timeout: float = 120.0, start_timeout: float = 30.0,
                 queue_budget: int | None = QUEUE_BUDGET) -> None:
        """``queue_budget``: bytes all senders into one NIC may have unacknowledged together
        (None: no bound but TCP's own)."""
        self.queue_budget = queue_budget
        self.rank, self.workers, self.dedicated = rank, workers, servers is not None
        self.shards = workers if servers is None else servers
        total = workers + (servers or 0)
        if not 0 <= rank < total:
            raise ValueError(f"rank {rank} is not in 0..{total - 1}")
        self.addresses = addresses or [star_address(i) for i in range(total)]
        self.timeout = timeout
        self.peers: dict[int, _Peer] = {}
        self.call = 0
        self._connect(port, start_timeout)

    # --- roles ------------------------------------------------------------------------
    def holder(self, shard: int) -> int:
        return shard + (self.workers if self.dedicated else 0)

    @property
    def is_worker(self) -> bool:
        return self.rank < self.workers

    @property
    def my_shard(self) -> int | None:
        shard = self.rank - (self.workers if self.dedicated else 0)
        return shard if 0 <= shard < self.shards else None

    def _partners(self) -> list[int]:
        total = len(self.addresses)
        return [p for p in range(total) if p != self.rank and (
            (self.rank < self.workers and (not self.dedicated or p >= self.workers))
            or (p < self.workers and (not self.dedicated or self.rank >= self.workers)))]

    def _connect(self, port: int, start_timeout: float) -> None:
        partners = self._partners()
        deadline = time.monotonic() + start_timeout
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.addresses[self.rank], port))
            listener.listen(len(partners) + 1)
            listener.settimeout(0.2)
            for other in (p for p in partners if p > self.rank):
                while True:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.settimeout(1.0)
                    try:
                        sock.connect((self.addresses[other], port))
                        break
                    except OSError:
                        sock.close()
                        if time.monotonic() > deadline:
                            raise PSError(f"participant {self.rank}: no connection to "
                                          f"participant {other} within {start_timeout:g} s: "
                                          "are all of them running?") from None
                        time.sleep(0.1)
                sock.sendall(HEADER.pack(HELLO, 0, self.rank, 0, 0))
                self._add(other, sock)
            waiting = {p for p in partners if p < self.rank}
            while waiting:
                if time.monotonic() > deadline:
                    raise PSError(f"participant {self.rank}: participants "
                                  f"{sorted(waiting)} did not connect within "
                                  f"{start_timeout:g} s")
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    continue
                sock.settimeout(5.0)
                hello = b""
                while len(hello) < HEADER.size:
                    chunk = sock.recv(HEADER.size - len(hello))
                    if not chunk:
                        break
                    hello += chunk
                kind, _call, other, _off, _count = HEADER.unpack(hello) \
                    if len(hello) == HEADER.size else (0, 0, -1, 0, 0)
                if kind != HELLO or other not in waiting:
                    sock.close()
                    continue
                waiting.discard(other)
                self._add(other, sock)
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()

    def fan_in(self, participant: int) -> int:
        """How many connections send into ``participant``'s NIC."""
        if not self.dedicated:
            return self.workers - 1
        return self.shards if participant < self.workers else self.workers

    def _add(self, other: int, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        force_buffers(sock, 4 << 20)
        sock.setblocking(False)
        limit = (max(9000, self.queue_budget // max(1, self.fan_in(other)))
                 if self.queue_budget else None)
        self.peers[other] = _Peer(other, sock, limit)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until the kernel has sent every byte and seen it acknowledged (SIOCOUTQ = 0):
        a call ends when its sums are received, possibly before this participant's last
        sends have left, and byte counts read then would miss them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
                unacked_bytes(p.sock)
                for p in self.peers.values() if not p.closed):
            time.sleep(0.01)

    def close(self) -> None:
        for peer in self.peers.values():
            peer.sock.close()
        self.peers = {}

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one call -----------------------------------------------------------------------
    def allreduce(self, gradient: np.ndarray | None, elements: int | None = None
                  ) -> np.ndarray | None:
        """Workers: the sum of every worker's ``gradient`` (float32). Dedicated servers pass
        None and the length (``elements``) and get None."""
        self.call = (self.call + 1) & 0xFF
        if self.is_worker:
            flat = np.ascontiguousarray(gradient, dtype=np.float32).ravel()
            elements = flat.size
        elif elements is None:
            raise ValueError("a dedicated PS server needs the gradient length")
        sizes = shard_sizes(elements, self.shards)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        result = np.zeros(elements, np.float32) if self.is_worker else None
        missing = 0  # values of the result still to come
        if self.is_worker:
            for shard in range(self.shards):
                lo, hi = starts[shard], starts[shard + 1]
                holder = self.holder(shard)
                if holder == self.rank:
                    continue
                missing += hi - lo
                peer = self.peers[holder]
                peer.expected += -(-(hi - lo) // PS_CHUNK_VALUES)  # its sums
                for off in range(0, hi - lo, PS_CHUNK_VALUES):
                    count = min(PS_CHUNK_VALUES, hi - lo - off)
                    peer.queue(HEADER.pack(PUSH, self.call, shard, off, count),
                               flat[lo + off:lo + off + count])
        mine = self.my_shard
        acc = counts = None
        expected = 0
        if mine is not None:
            lo, hi = starts[mine], starts[mine + 1]
            acc = (flat[lo:hi].astype(np.float64) if self.is_worker
                   else np.zeros(hi - lo, np.float64))
            chunks = -(-(hi - lo) // PS_CHUNK_VALUES)
            expected = self.workers - (1 if self.is_worker else 0)
            counts = np.zeros(chunks, np.int32)
            for worker in range(self.workers):
                if worker != self.rank:
                    self.peers[worker].expected += chunks  # its pushes
            pending = chunks if expected else 0
            if not expected:  # a lone worker holds its own sum
                result[lo:hi] = flat[lo:hi]
        else:
            pending = 0
        deadline = time.monotonic() + self.timeout
        peers = list(self.peers.values())
        while missing or pending or any(p.outbox for p in peers):
            if time.monotonic() > deadline:
                raise PSError(f"participant {self.rank}: the allreduce did not finish within "
                              f"{self.timeout:g} s ({missing} values of the sum and {pending} "
                              "chunks of its shard still to come)")
            poll = select.poll()
            waiting_acks = False  # something to send, but its bound is reached
            for peer in peers:
                writable = bool(peer.outbox) and peer.room() > 0
                waiting_acks |= bool(peer.outbox) and not writable
                poll.register(peer.sock, select.POLLIN | (select.POLLOUT if writable else 0))
            poll.poll(2 if waiting_acks else 50)
            for peer in peers:
                peer.flush()
                peer.fill()
                missing, pending = self._parse(peer, starts, result, acc, counts, expected,
                                               missing, pending)
                if peer.closed and peer.expected:
                    raise PSError(f"participant {self.rank}: participant {peer.index} closed "
                                  "its connection during the allreduce")
        return result

    def _parse(self, peer: _Peer, starts: np.ndarray, result: np.ndarray | None,
               acc: np.ndarray | None, counts: np.ndarray | None, expected: int,
               missing: int, pending: int) -> tuple[int, int]:
        inbox = peer.inbox
        data, first, offset, held = inbox.data, inbox.start, inbox.start, inbox.end
        view = memoryview(data)
        values = None
        try:
            while held - offset >= HEADER.size:
                kind, call, shard, off, count = HEADER.unpack_from(data, offset)
                end = offset + HEADER.size + 4 * count
                if held < end or call != self.call:  # the next call's: kept for it
                    break
                values = np.frombuffer(view[offset + HEADER.size:end], np.float32)
                offset = end
                peer.expected -= 1
                if kind == PUSH and acc is not None and shard == self.my_shard:
                    acc[off:off + count] += values
                    chunk = off // PS_CHUNK_VALUES
                    counts[chunk] += 1
                    if counts[chunk] == expected:
                        pending -= 1
                        total = acc[off:off + count].astype(np.float32)
                        lo = starts[shard]
                        if result is not None:
                            result[lo + off:lo + off + count] = total
                        head = HEADER.pack(SUM, self.call, shard, off, count)
                        for worker in range(self.workers):
                            if worker != self.rank:
                                self.peers[worker].queue(head, total)
                elif kind == SUM and result is not None:
                    lo = starts[shard]
                    result[lo + off:lo + off + count] = values
                    missing -= count
                else:
                    raise PSError(f"participant {self.rank}: unexpected message kind {kind} "
                                  f"for shard {shard} from participant {peer.index}")
                values = None  # no array may hold the inbox when it is refilled
        finally:
            values = None
            view.release()
            inbox.consume(offset - first)
        return missing, pending


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baselines.ps", description=__doc__.split(
        "\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one participant: a worker (--in, --out) or, "
                              "with --servers and rank >= world, a dedicated PS server")
    run.add_argument("--rank", type=int, required=True)
    run.add_argument("--world", type=int, required=True, help="number of workers")
    run.add_argument("--servers", type=int, help="dedicated PS servers (default: sharded "
                     "over the workers)")
    run.add_argument("--in", dest="input", type=Path, help="gradient .npy (workers)")
    run.add_argument("--out", type=Path, help="where to write the sum (workers)")
    run.add_argument("--elements", type=int, help="gradient length (dedicated servers)")
    run.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        with ParameterServer(args.rank, args.world, args.servers,
                             timeout=args.timeout) as ps:
            grad = np.load(args.input) if ps.is_worker else None
            if ps.is_worker and (args.input is None or args.out is None):
                raise ValueError("a worker needs --in and --out")
            elements = grad.size if grad is not None else args.elements
            ps.allreduce(np.ones(1024, np.float32) if ps.is_worker else None, 1024)  # barrier
            before = nic_counters(["eth0"])[0]
            started = time.monotonic()
            total = ps.allreduce(grad, elements)
            seconds = time.monotonic() - started
            ps.drain()
            after = nic_counters(["eth0"])[0]
        if total is not None:
            np.save(args.out, total.reshape(grad.shape))
    except (PSError, ValueError, OSError) as exc:
        print(f"ps: error: {exc}", file=sys.stderr)
        return 2
    print(f"ps: rank={args.rank} elements={elements} seconds={seconds:.3f} "
          f"goodput={32 * elements / max(seconds, 1e-9) / 1e6:.1f}Mbit/s "
          f"nic_bytes=eth0:{after[0] - before[0]}/{after[1] - before[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
