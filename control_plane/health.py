"""Health: notice within a bounded time when a switch stops answering, and when it is back.

Each switch is checked every ``period`` seconds: its P4Runtime stream must still be open and a
Capabilities call must answer within ``timeout``. So a dead switch is reported at most
``period + timeout`` seconds after it died. Events go to a callback and to the fabric's
``events.jsonl`` (which ``bml-ctl events`` shows). A switch that comes back without the
pipeline (it was restarted) is re-provisioned with everything the fabric says it should hold.

A monitor that starts (first start, or again after the control plane died) attaches to the
switches as they are: a switch that runs the pipeline is left alone (no pipeline push, no
writes, no slot resets; installed jobs keep aggregating), and only a switch found without one
(restarted while no monitor watched) is re-provisioned. A re-provisioning that fails is tried
again at every check until it succeeds; it holds the fabric's lock, so it never interleaves
with a ``bml-ctl job-add`` or ``job-remove``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from control_plane.fabric import WRITER_ELECTION, Fabric, locked
from control_plane.p4info import built_p4info
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
        self.attached: set[str] = set()  # answered this monitor at least once
        self.unprovisioned: set[str] = set()  # answering without the pipeline, to provision
        self.failing: set[str] = set()  # the last re-provisioning failed (said once)
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
        first_contact = name not in self.attached
        self.attached.add(name)
        came_back = name in self.down
        if came_back:
            self.down.discard(name)
            self._emit("switch_up", name, f"answering at {info['address']}")
        elif not first_contact:
            if name in self.unprovisioned:
                self._reprovision(name)  # the last attempt failed: again
            return
        if not self.reprovision:
            return
        try:
            running = session.running_p4info()
        except SwitchError:
            self.unprovisioned.add(name)  # cannot tell: the next check decides
            return
        if running is None:
            if not came_back:
                self._emit("switch_up", name, f"answering at {info['address']} without a "
                           "pipeline (restarted while no monitor watched)")
            self.unprovisioned.add(name)
            self._reprovision(name)
        else:
            self.unprovisioned.discard(name)  # attached: running, left exactly as it is

    def _reprovision(self, name: str) -> bool:
        """Pipeline, forwarding and every job the fabric holds for this switch; True when
        done. Writes replace what an interrupted earlier attempt may have left."""
        failed_before = name in self.failing
        try:
            with locked(self.fabric.path) as fabric:
                info = fabric.switches[name]
                session = SwitchSession(name, info["address"], info["device_id"],
                                        WRITER_ELECTION, timeout=max(self.timeout, 2.0),
                                        p4info=built_p4info(fabric.lanes))
                try:
                    switch = fabric.topo.switch(name)
                    if session.running_p4info() is not None and name not in self.failing:
                        self.unprovisioned.discard(name)  # someone else provisioned it
                        return True
                    provision_switch(session, fabric.topo, switch, replace=True)
                    groups = [g for plan in fabric.plans() for g in plan.groups
                              if g.switch == name]
                    for group in groups:
                        install_group(session, switch, group, replace=True)
                finally:
                    session.close()
        except (SwitchError, TimeoutError, OSError) as exc:
            self.unprovisioned.add(name)
            if not failed_before:
                self._emit("reprovision_failed", name, f"{exc} (trying again every check)")
            self.failing.add(name)
            return False
        self.unprovisioned.discard(name)
        self.failing.discard(name)
        self._emit("reprovisioned", name, f"pipeline, forwarding and {len(groups)} job(s)")
        return True

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
