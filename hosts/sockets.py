"""Socket settings shared by the hot paths (host transport and software switch)."""

from __future__ import annotations

import contextlib
import socket

# Linux values; Python's socket module does not export them.
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33


def force_buffers(sock: socket.socket, size: int = 8 << 20) -> None:
    """Large send/receive buffers past net.core.*mem_max (root only; silently kept otherwise),
    so bursts of results or contributions are queued rather than dropped."""
    for option in (SO_RCVBUFFORCE, SO_SNDBUFFORCE):
        with contextlib.suppress(PermissionError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)
