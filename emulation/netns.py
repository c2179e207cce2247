"""Namespaces, veth links and tc shaping through iproute2: the emulation's real network.

Every name this module creates starts with the run's tag, and ``sweep`` removes only names
with that tag, so tearing down one emulation never touches anything else on the machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass


class NetError(RuntimeError):
    pass


def run(*args: str, namespace: str | None = None, check: bool = True) -> str:
    command = list(args)
    if namespace:
        command = ["ip", "netns", "exec", namespace, *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetError(f"{command[0]} is not installed (apt-get install iproute2)") from None
    if check and done.returncode != 0:
        raise NetError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


def require_tools() -> None:
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetError(f"`{tool}` is missing: install iproute2")


@dataclass(frozen=True)
class Shaping:
    """tc netem parameters applied to both directions of every link."""

    rate: str | None = None  # e.g. "100mbit"
    delay: str | None = None  # e.g. "1ms"
    loss: float = 0.0  # percent
    reorder: float = 0.0  # percent (needs a delay)
    limit: int = 20000  # packets netem may queue

    def netem_args(self) -> list[str]:
        args: list[str] = ["limit", str(self.limit)]
        if self.delay:
            args += ["delay", self.delay]
        if self.reorder:
            if not self.delay:
                raise NetError("reordering needs a delay (netem reorders by sending some "
                               "packets without it)")
            args += ["reorder", f"{self.reorder}%", "50%"]
        if self.loss:
            args += ["loss", f"{self.loss}%"]
        if self.rate:
            args += ["rate", self.rate]
        return args

    @property
    def active(self) -> bool:
        return bool(self.rate or self.delay or self.loss or self.reorder)


def add_namespace(name: str) -> None:
    run("ip", "netns", "add", name)
    run("ip", "link", "set", "lo", "up", namespace=name)


def add_link(switch_side: str, host_side: str, namespace: str, host_name: str,
             mac: str, address: str) -> None:
    """A veth pair: one end stays in the root namespace for the switch, the other becomes
    ``host_name`` in the server's namespace with its MAC and address."""
    run("ip", "link", "add", switch_side, "type", "veth", "peer", "name", host_side)
    run("ip", "link", "set", host_side, "netns", namespace)
    run("ip", "link", "set", host_side, "name", host_name, namespace=namespace)
    run("ip", "link", "set", host_name, "address", mac, namespace=namespace)
    run("ip", "addr", "add", address, "dev", host_name, namespace=namespace)
    for interface, ns in ((switch_side, None), (host_name, namespace)):
        run("ip", "link", "set", interface, "mtu", "9000", namespace=ns)
        run("ip", "link", "set", interface, "up", namespace=ns)
        if shutil.which("ethtool"):
            # The switch copies frames as they are: checksums must be complete, segments
            # no larger than the MTU.
            run("ethtool", "-K", interface, "tx", "off", "tso", "off", "gso", "off",
                "gro", "off", namespace=ns, check=False)
    run("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", namespace=namespace, check=False)


def add_neighbour(namespace: str, interface: str, ip: str, mac: str) -> None:
    run("ip", "neigh", "replace", ip, "lladdr", mac, "dev", interface, "nud", "permanent",
        namespace=namespace)


def shape(interface: str, shaping: Shaping, namespace: str | None = None) -> None:
    run("tc", "qdisc", "replace", "dev", interface, "root", "netem", *shaping.netem_args(),
        namespace=namespace)


def namespaces() -> list[str]:
    out = run("ip", "-o", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def links() -> list[str]:
    out = run("ip", "-o", "link", "show", check=False)
    return [m.group(1).split("@")[0] for m in re.finditer(r"^\d+: ([^:]+):", out, re.M)]


def link_state(interface: str) -> str:
    out = run("ip", "-o", "link", "show", interface, check=False)
    match = re.search(r"state (\S+)", out)
    return match.group(1) if match else "MISSING"


def delete_namespace(name: str) -> None:
    run("ip", "netns", "delete", name, check=False)


def delete_link(name: str) -> None:
    run("ip", "link", "delete", name, check=False)


def tag_patterns(tag: str) -> tuple[re.Pattern, re.Pattern]:
    """Names of this tag's namespaces and switch-side links."""
    return re.compile(rf"^{re.escape(tag)}-h\d+$"), re.compile(rf"^{re.escape(tag)}\d+p\d+$")


def sweep(tag: str) -> list[str]:
    """Remove every namespace and link of this tag; returns what was removed."""
    ns_pattern, link_pattern = tag_patterns(tag)
    removed = []
    for name in namespaces():
        if ns_pattern.match(name):
            delete_namespace(name)
            removed.append(f"netns {name}")
    for name in links():
        if link_pattern.match(name):
            delete_link(name)
            removed.append(f"link {name}")
    return removed


def leftovers(tag: str) -> list[str]:
    ns_pattern, link_pattern = tag_patterns(tag)
    return ([f"netns {n}" for n in namespaces() if ns_pattern.match(n)]
            + [f"link {n}" for n in links() if link_pattern.match(n)])
