"""What one emulation made, saved as ``<run dir>/state.json`` after every step.

Written as things are made, not at the end, so that ``bml-net down`` can remove everything
even after a crash half-way through ``up``; every other module of the emulation reads and
updates this one record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bml.paths import RUN_ROOT
from bml.topology import Topology
from emulation.netns import NetError


@dataclass
class SwitchProcess:
    """One switch's entry in ``State.switches`` (stored as a plain dict, for JSON)."""

    name: str
    device_id: int
    address: str
    pid: int
    ports: dict[int, str]
    log: str


@dataclass
class State:
    """What one emulation made; written after every step."""

    name: str
    topology: str
    target: str
    shaping: dict = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    switches: dict[str, dict] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    jobs: dict[str, dict] = field(default_factory=dict)
    ready: bool = False
    monitor_pid: int = 0  # the control plane's health monitor (0: not running)
    # Faults injected by `bml-net fail` and not yet restored: switch names, the controller,
    # and links as "hX:ethL" -> which end is down ("server", "switch" or "both").
    failed_switches: list[str] = field(default_factory=list)
    failed_links: dict[str, str] = field(default_factory=dict)
    controller_failed: bool = False

    @property
    def tag(self) -> str:
        return self.name

    @property
    def run_dir(self) -> Path:
        return RUN_ROOT / self.name

    def save(self) -> None:
        """Replace state.json in one rename, so a crash never leaves half of it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.__dict__, indent=1, sort_keys=True))
        tmp.replace(self.run_dir / "state.json")

    @staticmethod
    def path(name: str) -> Path:
        return RUN_ROOT / name / "state.json"

    @classmethod
    def read(cls, name: str) -> State | None:
        """The saved state, or None if there is none (nothing made, or already down)."""
        path = cls.path(name)
        return cls(**json.loads(path.read_text())) if path.exists() else None

    @classmethod
    def load(cls, name: str) -> State:
        """The saved state of an emulation that must be up."""
        state = cls.read(name)
        if state is None:
            raise NetError(f"no emulation named {name!r} is up (no {cls.path(name)})")
        return state

    def topo(self) -> Topology:
        return Topology.parse(self.topology)

    def namespace_of(self, server: int) -> str:
        return f"{self.tag}-h{server}"

    def server_index(self, server: str) -> int:
        """``"h3"`` -> 3, refusing a server this topology does not have."""
        count = self.topo().num_servers
        index = int(server.lstrip("h")) if server.lstrip("h").isdigit() else -1
        if not 0 <= index < count:
            raise NetError(f"no server {server!r} in {self.topology} (h0..h{count - 1})")
        return index

    def switch_interface(self, device_id: int, port: int) -> str:
        """The switch-side veth end of a port (netns.tag_patterns matches these names)."""
        return f"{self.tag}{device_id}p{port}"

    def switch_addresses(self) -> dict[str, tuple[str, int]]:
        return {name: (sw["address"], sw["device_id"]) for name, sw in self.switches.items()}
