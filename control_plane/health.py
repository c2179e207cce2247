"""Health: notice within a bounded time when a switch stops answering, and when it is back.

Each switch is checked every ``period`` seconds: its P4Runtime stream must still be open and a
Capabilities call must answer within ``timeout``. So a dead switch is reported at most
``period + timeout`` seconds after it died. Events go to a callback and to the fabric's
``events.jsonl`` (which ``bml-ctl events`` shows). A switch that comes back without the
pipeline (it was restarted) is re-provisioned with everything the fabric says it should hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from control_plane.fabric import WRITER_ELECTION, Fabric
from control_plane.provision import install_group, provision_switch
from control_plane.session import SwitchError, SwitchSession
from control_plane.status import append_event

MONITOR_ELECTION = (0, 1)


class HealthMonitor:
    def __init__(self, fabric: Fabric, period: float = 0.5, timeout: float = 1.0,
                 on_event: Callable[[dict], None] | None = None,
                 reprovision: bool = True) -> None:
        self.fabric = fabric
        self.period = period
        self.timeout = timeout
        self.on_event = on_event or (lambda event: None)
        self.reprovision = reprovision
        self.sessions: dict[str, SwitchSession | None] = {name: None for name in fabric.switches}
        self.down: set[str] = set()
        self.stopping = threading.Event()

    def _emit(self, kind: str, switch: str, detail: str) -> None:
        self.on_event(append_event(self.fabric.events_path, kind, switch, detail))

    def check(self, name: str) -> None:
        info = self.fabric.switches[name]
        session = self.sessions[name]
        try:
            if session is None:
                session = SwitchSession(name, info["address"], info["device_id"],
                                        MONITOR_ELECTION, timeout=self.timeout, primary=False)
                self.sessions[name] = session
            if not session.stream_alive():
                raise SwitchError(f"switch {name}: P4Runtime stream closed")
            session.ping(self.timeout)
        except SwitchError as exc:
            if session is not None:
                session.close()
            self.sessions[name] = None
            if name not in self.down:
                self.down.add(name)
                self._emit("switch_down", name, str(exc))
            return
        if name in self.down:
            self.down.discard(name)
            self._emit("switch_up", name, f"answering at {info['address']}")
            if self.reprovision and session.running_p4info() is None:
                self._reprovision(name)

    def _reprovision(self, name: str) -> None:
        fabric = Fabric.load(self.fabric.path)
        info = fabric.switches[name]
        session = SwitchSession(name, info["address"], info["device_id"], WRITER_ELECTION)
        try:
            switch = fabric.topo.switch(name)
            provision_switch(session, fabric.topo, switch)
            groups = [g for plan in fabric.plans() for g in plan.groups if g.switch == name]
            for group in groups:
                install_group(session, switch, group)
            self._emit("reprovisioned", name, f"pipeline, forwarding and {len(groups)} job(s)")
        except (SwitchError, TimeoutError) as exc:
            self._emit("reprovision_failed", name, str(exc))
        finally:
            session.close()

    def run(self, duration: float | None = None) -> None:
        end = None if duration is None else time.monotonic() + duration
        while not self.stopping.is_set() and (end is None or time.monotonic() < end):
            started = time.monotonic()
            for name in self.sessions:
                self.check(name)
            self.stopping.wait(max(0.0, self.period - (time.monotonic() - started)))
        for session in self.sessions.values():
            if session is not None:
                session.close()
