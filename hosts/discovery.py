"""Where this server sits: its NICs, its switches, its server number and the topology, found
from the interfaces bml-net (or an operator following its addressing plan) configured."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bml.topology import Topology, TopologyError, server_of_ip


class DiscoveryError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalNic:
    level: int
    interface: str
    ip: str
    switch_ip: str
    peers: int  # other servers reachable on this level's switch


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False).stdout


def local_nics() -> list[LocalNic]:
    """eth0, eth1, ...: each with an address 10.(level+1).x.y, one switch neighbour
    10.(level+1).255.z and its peers (permanent neighbours installed by bml-net)."""
    nics = []
    for line in _ip("-o", "-4", "addr", "show").splitlines():
        match = re.search(r"^\d+: (eth\d+)\s+inet (\d+\.\d+\.\d+\.\d+)/", line)
        if not match:
            continue
        interface, ip = match.groups()
        try:
            _server, level = server_of_ip(ip)
        except TopologyError:
            continue
        neigh = _ip("-4", "neigh", "show", "dev", interface)
        switches = re.findall(r"^(\d+\.\d+\.255\.\d+) ", neigh, re.M)
        if len(switches) != 1:
            raise DiscoveryError(f"cannot tell the switch behind {interface}: expected one "
                                 f"x.y.255.z neighbour, found {switches or 'none'}")
        peers = len(re.findall(r"^\d+\.\d+\.\d+\.\d+ ", neigh, re.M)) - 1
        nics.append(LocalNic(level, interface, ip, switches[0], peers))
    nics.sort(key=lambda nic: nic.level)
    if not nics:
        raise DiscoveryError("no NIC here has a BML-INA address (10.(level+1).x.y): run this "
                             "inside an emulated server (bml-net exec hN -- ...)")
    if [nic.level for nic in nics] != list(range(len(nics))):
        raise DiscoveryError(f"NIC levels {[nic.level for nic in nics]} are not 0..k-1")
    return nics


def locate(nics: list[LocalNic]) -> tuple[int, Topology]:
    """(this server's number, the topology) from the NICs: k = NICs, n = peers per switch + 1.
    One NIC means the star."""
    servers = {server_of_ip(nic.ip)[0] for nic in nics}
    if len(servers) != 1:
        raise DiscoveryError(f"the NICs' addresses name different servers {sorted(servers)}")
    n = nics[0].peers + 1
    topology = Topology(n, 1, "star") if len(nics) == 1 else Topology(n, len(nics))
    server = servers.pop()
    if server >= topology.num_servers:
        raise DiscoveryError(f"server {server} is not in {topology.spec}")
    for nic in nics:
        expected = topology.nics(server)[nic.level]
        if expected.ip != nic.ip:
            raise DiscoveryError(f"{nic.interface} has {nic.ip}, but server {server} of "
                                 f"{topology.spec} has {expected.ip} on level {nic.level}")
    return server, topology


def nic_counters(interfaces: list[str]) -> list[tuple[int, int]]:
    """(tx, rx) bytes of each interface, from sysfs in this namespace."""
    out = []
    for name in interfaces:
        base = Path("/sys/class/net") / name / "statistics"
        try:
            out.append((int((base / "tx_bytes").read_text()),
                        int((base / "rx_bytes").read_text())))
        except (OSError, ValueError):
            out.append((0, 0))  # not an interface of this namespace: nothing to count
    return out
