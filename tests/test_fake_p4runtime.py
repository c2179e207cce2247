"""Failure paths of the control plane against in-process P4Runtime servers: no server, a server
that refuses one table's writes (as a full or broken switch does), a server that dies mid-way.

The fake is the software target's own servicer with one fault added, so every other answer
is the real one.
"""

from __future__ import annotations

import socket
import time

import pytest
from google.rpc import code_pb2

from bml.topology import Topology
from control_plane.fabric import create as create_fabric
from control_plane.health import HealthMonitor
from control_plane.p4info import Names
from control_plane.provision import provision_switch
from control_plane.session import SwitchError, SwitchSession, SwitchUnreachable
from soft_target.p4runtime_server import SoftP4RuntimeServicer, WriteError, serve
from tests.conftest import in_process_servicer


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TableFullServicer(SoftP4RuntimeServicer):
    """Refuses every insert into one table with RESOURCE_EXHAUSTED, as PI does when full."""

    def __init__(self, *args, full_table: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.full_table = full_table

    def _write_table_entry(self, p4info, update_type, entry):
        table = p4info.table_by_id.get(entry.table_id)
        if table is not None and table.name == self.full_table:
            raise WriteError(code_pb2.RESOURCE_EXHAUSTED, f"{table.name} is full")
        return super()._write_table_entry(p4info, update_type, entry)


@pytest.fixture
def full_host_address_table():
    server, port = serve(in_process_servicer(servicer_class=TableFullServicer,
                                             full_table=Names.HOST_ADDRESS), "127.0.0.1:0")
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_unreachable_switch_is_a_clear_bounded_error():
    address = f"127.0.0.1:{unused_port()}"
    started = time.monotonic()
    with pytest.raises(SwitchUnreachable) as error:
        SwitchSession("s1_2", address, timeout=1.0)
    assert time.monotonic() - started < 3.0
    assert "s1_2" in str(error.value) and address in str(error.value)


def test_rejected_write_names_the_switch_and_the_entry(full_host_address_table):
    topology = Topology.parse("star:4")
    session = SwitchSession("s0", full_host_address_table, timeout=3.0)
    started = time.monotonic()
    try:
        with pytest.raises(SwitchError) as error:
            provision_switch(session, topology, topology.switch("s0"))
    finally:
        session.close()
    message = str(error.value)
    assert time.monotonic() - started < 10.0
    assert message.startswith("switch s0 refused 4 of 4 writes")
    assert f"{Names.HOST_ADDRESS}[standard_metadata.egress_port=1]" in message
    assert "host_address is full" in message
    # What went before the refused batch is installed; nothing of the refused batch is.
    check = SwitchSession("check", full_host_address_table, timeout=3.0, stream=False)
    try:
        assert len(check.read_table(Names.L2_FORWARD)) == 4
        assert check.read_table(Names.HOST_ADDRESS) == []
    finally:
        check.close()


def test_switch_dying_mid_session_is_noticed_within_bounds(tmp_path):
    server, port = serve(in_process_servicer(), "127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    fabric = create_fabric(tmp_path / "fabric.json", Topology.parse("star:2"),
                           {"s0": (address, 1)})
    events: list[dict] = []
    monitor = HealthMonitor(fabric, period=0.2, timeout=0.5, on_event=events.append,
                            reprovision=False)
    try:
        monitor.check("s0")
        assert events == []
        server.stop(0)
        died = time.monotonic()
        while not events and time.monotonic() - died < 5.0:
            monitor.check("s0")
            time.sleep(0.1)
        assert time.monotonic() - died < monitor.period + monitor.timeout + 1.0
        assert [(e["kind"], e["switch"]) for e in events] == [("switch_down", "s0")]
        assert events[0]["detail"].startswith("switch s0")
    finally:
        server.stop(0)
        for session in monitor.sessions.values():
            if session is not None:
                session.close()
