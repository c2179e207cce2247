"""The switch's counters as the tests read and name them: the ``stats`` and ``drops`` arrays
(indexed by ``bml.protocol.Stat`` and ``DropReason``) and ``unaddressed`` (copies to a port
with no host address), from a switch over P4Runtime or from the software pipeline here."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bml.protocol import DROPS_SIZE, STATS_SIZE, DropReason, Stat
from control_plane.p4info import Names
from control_plane.session import SwitchSession

# Stats a contribution the switch admits moves (one of them): "stat:ADMITTED".
ADMITTED = (Stat.AGGREGATED, Stat.DUPLICATE, Stat.RETX_ANSWERED, Stat.PENDING)


@dataclass
class Counters:
    """One switch's counters at one moment."""

    stats: list[int]
    drops: list[int]
    unaddressed: int

    def total(self) -> int:
        return sum(self.stats) + sum(self.drops)


def read_session(session: SwitchSession) -> Counters:
    """A switch's counters over its P4Runtime session (``control_plane.session``); the arrays
    cut to the protocol's sizes (a target may have more cells)."""
    read = session.read_counter
    return Counters(read(Names.STATS)[:STATS_SIZE], read(Names.DROPS)[:DROPS_SIZE],
                    read(Names.UNADDRESSED)[0])


def read_pipeline(pipeline) -> Counters:
    """The software target's counters, straight from its ``soft_target.pipeline.Pipeline``."""
    return Counters(list(pipeline.stats), list(pipeline.drops), pipeline.unaddressed[0])


def moved(before: list[int], after: list[int], names: type[enum.IntEnum]) -> dict[str, int]:
    """The cells named in ``names`` that moved, by name, and by how much."""
    return {names(i).name: a - b for i, (b, a) in enumerate(zip(before, after, strict=True))
            if a != b and i in names._value2member_map_}


def named(counts: dict[int, int], names: type[enum.IntEnum]) -> dict[str, int]:
    """``{index: count}`` by name, zeros left out (what ``moved`` would report)."""
    return {names(i).name: n for i, n in counts.items() if n}


def counter_keys() -> list[str]:
    """Keys that name one counter each, or a group: every drop reason ("drop:REASON"), then
    the stats a refused-but-answered or an admitted frame moves ("stat:NAME",
    "stat:ADMITTED")."""
    return [f"drop:{r.name}" for r in DropReason] + ["stat:OLD_CALL", "stat:GENERATION",
                                                     "stat:ADMITTED"]


def key_value(key: str, stats: list[int], drops: list[int]) -> int:
    """The value of the counter (or group) ``key`` names."""
    kind, name = key.split(":")
    if kind == "drop":
        return drops[DropReason[name]]
    if name == "ADMITTED":
        return sum(stats[s] for s in ADMITTED)
    return stats[Stat[name]]


class SwitchCounters:
    """Stats and drops of several switches, read over P4Runtime (sessions without a stream:
    reads only, so a controller's primary session is not disturbed)."""

    def __init__(self, switches: dict[str, tuple[str, int]]) -> None:
        self.sessions: dict[str, SwitchSession] = {}
        try:
            for name, (address, device_id) in switches.items():
                self.sessions[name] = SwitchSession(name, address, device_id, timeout=5.0,
                                                    stream=False)
        except BaseException:
            self.close()
            raise

    def read(self, name: str) -> tuple[list[int], list[int]]:
        session = self.sessions[name]
        return session.read_counter(Names.STATS), session.read_counter(Names.DROPS)

    def read_all(self) -> dict[str, tuple[list[int], list[int]]]:
        return {name: self.read(name) for name in self.sessions}

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
