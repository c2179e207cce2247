"""Network namespaces for tests: packet sockets opened inside one (so that a test drives a
server's or a switch's links from outside), a namespace of veth pairs of a test's own, and the
losses the kernel counts on the way (a test that expects exact counters must see none)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from emulation.testbed import in_namespace

_LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
T = TypeVar("T")


def in_netns(namespace: str, make: Callable[[], T]) -> T:
    """``make()`` run in network namespace ``namespace`` (a thread that enters it and ends):
    sockets it opens stay in that namespace."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
            try:
                if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {namespace}: {os.strerror(err)}")
            finally:
                os.close(fd)
            outcome["value"] = make()
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"netns-{namespace}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def send_socket(namespace: str, interface: str) -> socket.socket:
    """A raw socket on ``interface`` that only sends (protocol 0: nothing is received)."""
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.bind((interface, 0))
        return sock
    return in_netns(namespace, make)


def receive_socket(namespace: str, interface: str) -> socket.socket:
    """A raw socket that receives every frame arriving on ``interface`` (not its own)."""
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.bind((interface, 0))
        sock.settimeout(0.2)
        return sock
    return in_netns(namespace, make)


def interface_drops(namespace: str | None, interface: str) -> tuple[int, int]:
    """(rx dropped, tx dropped) of an interface, from ``ip -s -j link``."""
    command = ["ip", *(["-n", namespace] if namespace else []), "-s", "-j", "link", "show",
               "dev", interface]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        stats = json.loads(done.stdout)[0]["stats64"]
    except (ValueError, IndexError, KeyError):
        return 0, 0
    return stats["rx"]["dropped"], stats["tx"]["dropped"]


def socket_drops(pids: Iterable[int]) -> int:
    """Frames the packet sockets of processes ``pids`` dropped (``ss -0 -m``: sk_drops, e.g.
    a full receive buffer or capture ring): lost before the process saw them."""
    pids = list(pids)
    done = subprocess.run(["ss", "-0", "-m", "-p", "-H"], capture_output=True, text=True,
                          check=False)
    total = 0
    for line in done.stdout.splitlines():
        if any(f"pid={pid}," in line for pid in pids):
            match = re.search(r"skmem:\(.*\bd(\d+)\)", line)
            total += int(match.group(1)) if match else 0
    return total


def fresh_namespace(namespace: str) -> None:
    """``namespace`` created anew (one left by an earlier run deleted), loopback up, IPv6 off
    (no router solicitations or MLD on its ports)."""
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
    subprocess.run(["ip", "netns", "add", namespace], check=True, capture_output=True)
    for key in ("all", "default"):
        in_namespace(namespace, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1",
                     check=False)
    in_namespace(namespace, "ip", "link", "set", "lo", "up")


def add_veth(namespace: str, one: str, other: str, mtu: int = 9000) -> None:
    """A veth pair ``one``/``other`` in ``namespace``, both up at ``mtu``."""
    in_namespace(namespace, "ip", "link", "add", one, "type", "veth", "peer", "name", other)
    for name in (one, other):
        in_namespace(namespace, "ip", "link", "set", name, "mtu", str(mtu), "up")


def delete_namespace(namespace: str) -> None:
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
