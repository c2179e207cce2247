"""Socket settings shared by every hot path: the host agent, its mesh, the baselines and the
software switch."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import termios

# Linux values; Python's socket module does not export them.
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33


def force_buffers(sock: socket.socket, size: int = 8 << 20) -> None:
    """Large send/receive buffers past net.core.*mem_max (root only; silently kept otherwise),
    so bursts of results or contributions are queued rather than dropped."""
    for option in (SO_RCVBUFFORCE, SO_SNDBUFFORCE):
        with contextlib.suppress(PermissionError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)


# Every NIC is the receiving end of several TCP connections at once (incast). TCP alone grows
# each window until the shaped link's queue overflows, and with jumbo segments the losses cost
# whole segments and timeouts. So a sender keeps at most QUEUE_BUDGET / (its receiver's
# fan-in) bytes unacknowledged on a connection: 3/4 of bml-net's 256 KB queue in all, enough
# to keep the link busy, with a quarter left for what else arrives (ACKs, other flows' bursts).
QUEUE_BUDGET = 192_000


def unacked_bytes(sock: socket.socket) -> int:
    """Bytes handed to the kernel on a TCP socket and not yet acknowledged (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


def read_available(sock: socket.socket, inbox: bytearray, chunk: int = 1 << 18) -> bool:
    """Append what a non-blocking stream socket has to ``inbox``; False once the peer has
    closed (EOF or an error), True while it is open."""
    while True:
        try:
            data = sock.recv(chunk)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        inbox += data
