"""Readable tables of what the switches count and what the health monitor saw."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bml.protocol import DropReason, Stat
from control_plane.p4info import Names
from control_plane.session import SwitchError, SwitchSession


def read_counters(name: str, address: str, device_id: int) -> dict[str, int]:
    """Every named stat and drop reason of one switch (drop reasons prefixed ``drop:``)."""
    session = SwitchSession(name, address, device_id, timeout=2.0, stream=False)
    try:
        stats = session.read_counter(Names.STATS)
        drops = session.read_counter(Names.DROPS)
        unaddressed = session.read_counter(Names.UNADDRESSED)[0]
    finally:
        session.close()
    result = {s.name.lower(): stats[s] for s in Stat}
    result.update({f"drop:{r.name.lower()}": drops[r] for r in DropReason})
    result["unaddressed"] = unaddressed
    return result


def switch_lines(fabric) -> list[str]:
    """One row per switch: where it is, whether it answers, whether it runs our pipeline."""
    lines = [f"{'switch':<8} {'level':>5} {'device':>6} {'P4Runtime':<20} {'answers':<8} pipeline"]
    topology = fabric.topo
    for name, info in fabric.switches.items():
        try:
            session = SwitchSession(name, info["address"], info["device_id"], timeout=2.0,
                                    stream=False)
        except SwitchError:
            answers, pipeline = "NO", "-"
        else:
            try:
                running = session.running_p4info()
                answers = "yes"
                pipeline = ("none" if running is None
                            else "bml" if running == session.p4info.message else "OTHER")
            except SwitchError:
                answers, pipeline = "NO", "-"
            finally:
                session.close()
        lines.append(f"{name:<8} {topology.switch(name).level:>5} {info['device_id']:>6} "
                     f"{info['address']:<20} {answers:<8} {pipeline}")
    return lines


def counter_table(switches: dict[str, tuple[str, int]]) -> list[str]:
    """One row per switch, one column per counter that is non-zero somewhere."""
    rows: dict[str, dict[str, int] | str] = {}
    for name, (address, device_id) in switches.items():
        try:
            rows[name] = read_counters(name, address, device_id)
        except SwitchError as exc:
            rows[name] = f"unreachable: {exc}"
    columns = [c for c in (next((r for r in rows.values() if isinstance(r, dict)), {}) or {})
               if any(isinstance(r, dict) and r[c] for r in rows.values())]
    columns = columns or ["aggregated", "completed"]
    widths = [max(len(c), 6) for c in columns]
    lines = ["counters  " + " ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True))]
    for name, row in rows.items():
        if isinstance(row, str):
            lines.append(f"{name:<9} {row}")
        else:
            lines.append(f"{name:<9} " + " ".join(f"{row[c]:>{w}}"
                                                  for c, w in zip(columns, widths, strict=True)))
    return lines


def append_event(path: Path, kind: str, switch: str, detail: str) -> dict:
    event = {"time": time.time(), "kind": kind, "switch": switch, "detail": detail}
    with open(path, "a") as out:
        out.write(json.dumps(event) + "\n")
    return event


def read_events(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def event_lines(path: Path, last: int = 20) -> list[str]:
    events = read_events(path)[-last:]
    if not events:
        return ["health events: none"]
    lines = ["health events:"]
    for event in events:
        stamp = time.strftime("%H:%M:%S", time.localtime(event["time"]))
        lines.append(f"  {stamp} {event['kind']:<14} {event['switch']:<8} {event['detail']}")
    return lines
