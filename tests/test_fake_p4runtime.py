"""Failure paths of the control plane's P4Runtime session (no server, a dead address)."""

from __future__ import annotations

import socket
import time

import pytest

from control_plane.session import SwitchSession, SwitchUnreachable


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_switch_is_a_clear_bounded_error():
    address = f"127.0.0.1:{unused_port()}"
    started = time.monotonic()
    with pytest.raises(SwitchUnreachable) as error:
        SwitchSession("s1_2", address, timeout=1.0)
    assert time.monotonic() - started < 3.0
    assert "s1_2" in str(error.value) and address in str(error.value)
