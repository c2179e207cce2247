"""Namespaces, veth links and tc shaping through iproute2: the emulation's real network.

Every name this module creates starts with the run's tag, and ``sweep`` removes only names
with that tag, so tearing down one emulation never touches anything else on the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from bml import cost_model


class NetError(RuntimeError):
    pass


def run(*args: str, namespace: str | None = None, check: bool = True,
        stdin: str | None = None) -> str:
    command = list(args)
    if namespace:
        command = ["ip", "netns", "exec", namespace, *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, input=stdin)
    except FileNotFoundError:
        raise NetError(f"{command[0]} is not installed (run `make setup`)") from None
    if check and done.returncode != 0:
        raise NetError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


def require_tools() -> None:
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise NetError(f"`{tool}` is missing: install {package} (make setup does)")


def rate_bits(rate: str) -> int:
    """``100mbit`` -> 100_000_000 (tc's decimal units); a bad rate is a NetError here."""
    try:
        return cost_model.rate_bits(rate)
    except ValueError as exc:
        raise NetError(str(exc)) from None


@dataclass(frozen=True)
class Shaping:
    """Impairments of every link.

    Each is done by a kernel part that exists on every Linux this runs on, except delay: the
    rate by a ``tbf`` qdisc on both ends, loss by an nftables ``numgen random`` drop on the
    server's end (both directions), reordering by an nftables detour of the server's packets
    through a queue of their own (see ``shape_link``), delay by ``netem``, which some kernels
    (this project's CI VMs among them) are built without: asking for it there is refused.
    """

    rate: str | None = None  # e.g. "100mbit"
    delay: str | None = None  # e.g. "1ms"
    loss: float = 0.0  # percent, per direction
    reorder: float = 0.0  # percent of the server's packets that take the detour
    queue_seconds: float = 0.2  # how much traffic the rate limiter may queue, in time

    def check(self) -> None:
        """Refuse what cannot be done, before anything is created."""
        if self.rate:
            rate_bits(self.rate)
        if not 0.0 <= self.loss < 100.0:
            raise NetError(f"loss must be a percentage in [0, 100), got {self.loss}")
        if not 0.0 <= self.reorder <= 100.0:
            raise NetError(f"reorder must be a percentage in [0, 100], got {self.reorder}")
        if self.delay and not kernel_has_netem():
            raise NetError("delay needs the kernel's netem qdisc (sch_netem), which this "
                           "kernel lacks; rate, loss and reordering work without it")

    def netem_args(self) -> list[str]:
        args: list[str] = ["limit", "100000"]
        if self.delay:
            args += ["delay", self.delay]
        return args

    @property
    def queue_bytes(self) -> int:
        """The rate limiter's queue: ``queue_seconds`` of line rate, at least 256 KB."""
        return max(256_000, int(rate_bits(self.rate) / 8 * self.queue_seconds))

    def tbf_args(self) -> list[str]:
        """Arguments of the ``tbf`` qdisc for ``rate`` (only asked for when there is one)."""
        bits = rate_bits(self.rate)
        burst = max(16_000, bits // 8 // 500)  # 2 ms of line rate, at least a few frames
        return ["rate", self.rate, "burst", str(burst), "limit", str(self.queue_bytes)]

    @property
    def tcp_rto_min_us(self) -> int:
        """The least TCP retransmission timeout of the servers: Linux's 200 ms, or the time
        the link's queue takes to drain if longer (see ``LINUX_TCP_RTO_MIN_US``)."""
        if not self.rate:
            return LINUX_TCP_RTO_MIN_US
        drain = self.queue_bytes * 8 / rate_bits(self.rate)
        return max(LINUX_TCP_RTO_MIN_US, round(drain * 1e6))

    @property
    def active(self) -> bool:
        return bool(self.rate or self.delay or self.loss or self.reorder)


_netem: bool | None = None


def kernel_has_netem() -> bool:
    """Whether tc can make a netem qdisc here (probed once on a throwaway veth)."""
    global _netem
    if _netem is None:
        probe = f"bmlnetem{os.getpid()}"
        run("ip", "netns", "add", probe)
        try:
            run("ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1", namespace=probe)
            done = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev",
                                   "p0", "root", "netem", "delay", "1ms"], capture_output=True)
            _netem = done.returncode == 0
        finally:
            run("ip", "netns", "delete", probe, check=False)
    return _netem


# The most a server's TCP receiver advertises: 3/4 of a shaped link's queue (bml-net's tbf
# queue is 256 KB). With Linux's default (32 MB) one flow's window grew until it overflowed
# the queue, and its losses and 1 s queueing delays stalled gloo's ring, whose steps depend
# on each other (star:12 at 2 Mbit/s, 1M floats: 1.20x of the ring's prediction, 1.02x with
# this); servers size their buffers to the path, and every TCP scheme here gets the same.
SERVER_TCP_RMEM_MAX = 196_608
# The most a TCP connection of a server keeps in its NIC's queue (TCP Small Queues: the
# namespace's tcp_limit_output_bytes, 4 MB by default), about two 9000-byte segments: what
# TSQ keeps at a real NIC's line rate. Here the NIC's rate is the server end's tbf, and Linux
# sizes TSQ's share from the pacing rate, which it derives from the sub-millisecond RTT the
# connection starts with: a connection queued there all its window let it (the mesh's
# 96 KB per neighbour: 0.4 s at 2 Mbit/s), that delay came into its RTT faster than its
# timeout adapted, and TCP timed out and re-sent segments still in that queue
# (bcube:3,2 host-based at 2 Mbit/s, 256K floats: 170 re-sent segments, all spurious, 1.24-
# 1.33x of the prediction; with this ~60, 1.09-1.10x). A segment waits in the socket instead.
SERVER_TCP_LIMIT_OUTPUT_BYTES = 16_000
# Linux's least TCP retransmission timeout is sized for links where a full queue drains in
# milliseconds; a link emulated at 2 Mbit/s takes 1 s to drain its 256 KB queue, and a
# segment that waited its turn there (a step's burst, an ACK behind its server's own data)
# was presumed lost after 200 ms (bcube:3,2 host-based at 2 Mbit/s: 40-70 timeouts per call,
# all spurious, and a stalled connection each time; at 1M floats 1.14x of the prediction,
# 1.08-1.11x with none). So a server's TCP waits at least as long as its link's queue takes to
# drain (``Shaping.tcp_rto_min_us``): Linux's own value at 10 Mbit/s and above.
LINUX_TCP_RTO_MIN_US = 200_000


def add_namespace(name: str) -> None:
    """A server's namespace, IPv4 only: interfaces moved in later send no IPv6 chatter
    (router solicitations, MLD) into the switches; TCP receive buffers sized to the link's
    queue (``SERVER_TCP_RMEM_MAX``), its send queue at the NIC to two segments
    (``SERVER_TCP_LIMIT_OUTPUT_BYTES``)."""
    run("ip", "netns", "add", name)
    for scope in ("all", "default"):
        run("sysctl", "-qw", f"net.ipv6.conf.{scope}.disable_ipv6=1", namespace=name,
            check=False)
    run("sysctl", "-qw", f"net.ipv4.tcp_rmem=4096 131072 {SERVER_TCP_RMEM_MAX}",
        namespace=name, check=False)
    run("sysctl", "-qw", f"net.ipv4.tcp_limit_output_bytes={SERVER_TCP_LIMIT_OUTPUT_BYTES}",
        namespace=name, check=False)
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


_DETOURED = "0x42"  # packet mark: has taken the detour once, goes straight on
DETOUR_RATE = "20mbit"  # the detour's own rate where the link has none
DETOUR_QUEUE_BYTES = 100_000


def _random_share(percent: float) -> str:
    """An nftables expression true for ``percent`` % of packets, at random."""
    return f"numgen random mod 1000000 < {round(percent * 10_000)}"


def shape_link(switch_side: str, host_side: str, namespace: str, shaping: Shaping) -> None:
    """Apply ``shaping`` to one link (replacing what it had); an inactive one clears it.

    Reordering without netem: a share of the server's packets is forwarded (nftables ``fwd``)
    through a detour, a veth pair in the server's namespace with a ``tbf`` queue of its own,
    and then out of the link; whatever queues there arrives after packets sent later.
    """
    run("sysctl", "-qw", f"net.ipv4.tcp_rto_min_us={shaping.tcp_rto_min_us}",
        namespace=namespace, check=False)
    for interface, ns in ((switch_side, None), (host_side, namespace)):
        run("tc", "qdisc", "del", "dev", interface, "root", namespace=ns, check=False)
        parent = ["root"]
        if shaping.delay:
            run("tc", "qdisc", "add", "dev", interface, "root", "handle", "1:", "netem",
                *shaping.netem_args(), namespace=ns)
            parent = ["parent", "1:1"]
        if shaping.rate:
            run("tc", "qdisc", "add", "dev", interface, *parent, "handle", "10:", "tbf",
                *shaping.tbf_args(), namespace=ns)
    table = f"bml_{host_side}"
    detour_in, detour_out = f"{host_side}ra", f"{host_side}rb"
    run("nft", "delete", "table", "netdev", table, namespace=namespace, check=False)
    run("ip", "link", "delete", detour_in, namespace=namespace, check=False)
    egress, ingress, chains = [], [], []
    if shaping.loss:
        drop = f"{_random_share(shaping.loss)} counter drop"
        egress.append(f"meta mark != {_DETOURED} {drop}")
        ingress.append(drop)
    if shaping.reorder:
        run("ip", "link", "add", detour_in, "type", "veth", "peer", "name", detour_out,
            namespace=namespace)
        for interface in (detour_in, detour_out):
            run("ip", "link", "set", interface, "mtu", "9000", "up", namespace=namespace)
        rate = shaping.rate or DETOUR_RATE
        run("tc", "qdisc", "add", "dev", detour_in, "root", "tbf", "rate", rate, "burst",
            "16000", "limit", str(DETOUR_QUEUE_BYTES), namespace=namespace)
        egress.append(f"meta mark != {_DETOURED} {_random_share(shaping.reorder)} "
                      f"meta mark set {_DETOURED} counter fwd to \"{detour_in}\"")
        chains.append(f"  chain detour {{ type filter hook ingress device \"{detour_out}\" "
                      f"priority 0; counter fwd to \"{host_side}\"; }}")
    for hook, rules in (("egress", egress), ("ingress", ingress)):
        if rules:
            chains.append(f"  chain {hook} {{ type filter hook {hook} device \"{host_side}\" "
                          f"priority 0; {'; '.join(rules)}; }}")
    if chains:
        run("nft", "-f", "-", namespace=namespace,
            stdin=f"table netdev {table} {{\n" + "\n".join(chains) + "\n}\n")


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
