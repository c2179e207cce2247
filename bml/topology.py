"""Topologies: BCube(n, k) as DESIGN.md defines it, the single-switch star, and addressing.

BCube(n, k): k levels, N = n**k servers, k * n**(k-1) switches of n ports. Server a has digits
(a_(k-1) ... a_0) in base n; its NIC l goes to the level-l switch that joins every server equal
to a except in digit l, on port a_l + 1. A star of N servers is BCube(N, 1): one switch, one
NIC per server. Each level is one IPv4 subnet, 10.(l+1).0.0/16.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

# The addressing plan: server NICs at 10.(level+1).x.y with x below SWITCH_OCTETS[0], switches
# at 10.(level+1).x.y with x from 255 down (250 a third octet). The emulation caps it lower.
SWITCH_OCTETS = range(250, 256)
MAX_SERVERS = 250 * SWITCH_OCTETS[0]
MAX_SWITCHES_PER_LEVEL = 250 * len(SWITCH_OCTETS)


class TopologyError(ValueError):
    pass


@dataclass(frozen=True)
class Nic:
    server: int
    level: int
    switch: str
    port: int

    @property
    def interface(self) -> str:
        return f"eth{self.level}"

    @property
    def mac(self) -> str:
        return _mac(0x00, self.level, self.server)

    @property
    def ip(self) -> str:
        return f"10.{self.level + 1}.{self.server // 250}.{self.server % 250 + 1}"


@dataclass(frozen=True)
class Switch:
    name: str
    level: int
    index: int  # within its level
    device_id: int  # unique across the topology, 1-based
    servers: tuple[int, ...]  # servers on ports 1..n, in port order

    @property
    def mac(self) -> str:
        return _mac(0xFF, self.level, self.index)

    @property
    def ip(self) -> str:
        """The switch's aggregation address in its level's subnet."""
        return f"10.{self.level + 1}.{255 - self.index // 250}.{self.index % 250 + 1}"

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(range(1, len(self.servers) + 1))

    def port_of(self, server: int) -> int:
        return self.servers.index(server) + 1


def _mac(kind: int, level: int, number: int) -> str:
    return f"02:b1:{kind:02x}:{level:02x}:{number >> 8:02x}:{number & 0xFF:02x}"


def server_of_ip(ip: str) -> tuple[int, int]:
    """(server, level) of a server NIC's address: the inverse of ``Nic.ip``."""
    try:
        a, b, c, d = (int(x) for x in ip.split("."))
    except ValueError:
        raise TopologyError(f"{ip!r} is not an IPv4 address") from None
    if a != 10 or b < 1 or c >= SWITCH_OCTETS[0] or not 1 <= d <= 250:
        raise TopologyError(f"{ip} is not a server address of the plan 10.(level+1).x.y")
    return c * 250 + d - 1, b - 1


def mac_to_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def ip_to_int(ip: str) -> int:
    a, b, c, d = (int(x) for x in ip.split("."))
    return a << 24 | b << 16 | c << 8 | d


@dataclass(frozen=True)
class Topology:
    """BCube(n, k); ``kind`` says how the user named it (``star:N`` is BCube(N, 1))."""

    n: int
    k: int
    kind: str = "bcube"

    def __post_init__(self) -> None:
        if self.n < 2:
            raise TopologyError(f"n must be at least 2 (got n={self.n})")
        if self.k < 1:
            raise TopologyError(f"k must be at least 1 (got k={self.k})")
        if self.n ** self.k > MAX_SERVERS:
            raise TopologyError(f"BCube({self.n},{self.k}) has {self.n ** self.k} servers; "
                                f"the addressing plan numbers at most {MAX_SERVERS}")
        if self.n ** (self.k - 1) > MAX_SWITCHES_PER_LEVEL:
            raise TopologyError(f"BCube({self.n},{self.k}) has {self.n ** (self.k - 1)} "
                                f"switches per level; the addressing plan numbers at most "
                                f"{MAX_SWITCHES_PER_LEVEL}")

    @classmethod
    def parse(cls, spec: str) -> Topology:
        """``star:N`` or ``bcube:n,k``."""
        kind, _, args = spec.partition(":")
        try:
            numbers = [int(x) for x in args.split(",")] if args else []
        except ValueError:
            raise TopologyError(f"bad topology {spec!r}: numbers expected") from None
        if kind == "star" and len(numbers) == 1:
            return cls(numbers[0], 1, "star")
        if kind == "bcube" and len(numbers) == 2:
            return cls(numbers[0], numbers[1], "bcube")
        raise TopologyError(f"bad topology {spec!r}: use star:N or bcube:n,k")

    @property
    def spec(self) -> str:
        return f"star:{self.n}" if self.kind == "star" else f"bcube:{self.n},{self.k}"

    @property
    def num_servers(self) -> int:
        return self.n ** self.k

    @property
    def num_switches(self) -> int:
        return self.k * self.n ** (self.k - 1)

    def digits(self, server: int) -> tuple[int, ...]:
        """(a_0, a_1, ..., a_(k-1)): digit l is the server's position on its level-l switch."""
        return tuple((server // self.n ** level) % self.n for level in range(self.k))

    def server_of(self, digits: tuple[int, ...]) -> int:
        return sum(d * self.n ** level for level, d in enumerate(digits))

    def switch_index(self, server: int, level: int) -> int:
        """Index within level ``level`` of the switch that server's NIC l attaches to."""
        others = [d for lvl, d in enumerate(self.digits(server)) if lvl != level]
        return sum(d * self.n ** i for i, d in enumerate(others))

    @cached_property
    def switches(self) -> tuple[Switch, ...]:
        result = []
        for level in range(self.k):
            members: dict[int, list[int]] = {}
            for server in range(self.num_servers):
                members.setdefault(self.switch_index(server, level), []).append(server)
            for index in sorted(members):
                servers = sorted(members[index], key=lambda s: self.digits(s)[level])
                name = "s0" if self.kind == "star" else f"s{level}_{index}"
                result.append(Switch(name, level, index, len(result) + 1, tuple(servers)))
        return tuple(result)

    def switch_at(self, level: int, index: int) -> Switch:
        return self.switches[level * self.n ** (self.k - 1) + index]

    def switch(self, name: str) -> Switch:
        for sw in self.switches:
            if sw.name == name:
                return sw
        raise TopologyError(f"no switch {name!r} in {self.spec}")

    def nics(self, server: int) -> tuple[Nic, ...]:
        result = []
        for level in range(self.k):
            sw = self.switch_at(level, self.switch_index(server, level))
            result.append(Nic(server, level, sw.name, sw.port_of(server)))
        return tuple(result)

    def neighbours(self, server: int, level: int) -> tuple[int, ...]:
        """The other servers on server's level-l switch."""
        sw = self.switch(self.nics(server)[level].switch)
        return tuple(s for s in sw.servers if s != server)

    # --- detours: BCube's other paths, for a group whose switch (or a member's link) failed --
    def detour_level(self, level: int) -> int:
        """The level whose NICs carry a failed level-``level`` group's traffic."""
        return (level + 1) % self.k

    def relay(self, server: int, level: int) -> int:
        """The server that forwards ``server``'s traffic to its level-``level`` neighbours when
        their switch cannot: its neighbour on the detour level m, digit m one up. The relays
        of one group are themselves one level-l group, on another switch, so a detour is
        server -> relay (level m) -> the peer's relay (level l) -> peer (level m)."""
        if self.k < 2:
            raise TopologyError(f"{self.spec} has one level: there is no other path")
        m = self.detour_level(level)
        digits = list(self.digits(server))
        digits[m] = (digits[m] + 1) % self.n
        return self.server_of(tuple(digits))

    def detour_routes(self, server: int) -> list[tuple[str, str, str]]:
        """(destination, gateway, interface) of the host routes ``server`` needs for every
        detour: as a sender, to each level-l neighbour's level-m address via its relay; as a
        relay, onwards to the peer's relay on level l. They are installed ahead (they change
        nothing while every switch works: no other traffic goes to those addresses that way)
        and need IP forwarding on."""
        if self.k < 2:
            return []
        routes = []
        for level in range(self.k):
            m = self.detour_level(level)
            relay = self.relay(server, level)
            for peer in self.neighbours(server, level):
                routes.append((self.nics(peer)[m].ip, self.nics(relay)[m].ip, f"eth{m}"))
            digits = list(self.digits(server))
            digits[m] = (digits[m] - 1) % self.n
            client = self.server_of(tuple(digits))  # whose relay this server is
            for peer in self.neighbours(client, level):
                routes.append((self.nics(peer)[m].ip,
                               self.nics(self.relay(peer, level))[level].ip, f"eth{level}"))
        return routes
