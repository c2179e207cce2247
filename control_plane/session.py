"""One P4Runtime session per switch.

p4runtime-shell keeps a single global client per process (``p4runtime_sh.shell.client``), so
its shell API cannot talk to several switches at once. The control plane therefore uses the
shell's ``P4RuntimeClient`` class directly, one instance per switch, and builds its messages
from the P4Info with ``control_plane.p4info``. The subclass below replaces the two places
where the library calls ``sys.exit`` (no server, no arbitration answer) with exceptions that
name the switch, so a dead switch is an error to handle, not the end of the process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2
from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException

from bml.protocol import CONTROLLER_MAGIC, Wire, wire
from control_plane.p4info import P4Info, built_device_config, built_p4info


class SwitchError(RuntimeError):
    """A switch refused or could not be reached; the message names the switch."""


class SwitchUnreachable(SwitchError):
    pass


def encode(value: int, bitwidth: int) -> bytes:
    """P4Runtime's canonical bytestring: big-endian, no leading zero bytes."""
    if value < 0 or value >= 1 << bitwidth:
        raise ValueError(f"{value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


@dataclass(frozen=True)
class Entry:
    """A table entry by names, as the control plane thinks of it."""

    table: str
    match: tuple[tuple[str, int], ...]
    action: str
    params: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        match = ", ".join(f"{k}={v}" for k, v in self.match)
        params = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.table}[{match}] -> {self.action}({params})"


def entry(table: str, match: dict[str, int], action: str, **params: int) -> Entry:
    return Entry(table, tuple(match.items()), action, tuple(params.items()))


class _Client(P4RuntimeClient):
    """P4RuntimeClient that raises instead of exiting, and waits a bounded time."""

    def __init__(self, name: str, address: str, device_id: int, election_id: tuple[int, int],
                 timeout: float, primary: bool, stream: bool) -> None:
        self.switch_name = name
        self.address = address
        self.timeout = timeout
        self.require_primary = primary
        self.with_stream = stream
        super().__init__(device_id, address, election_id)

    def set_up_stream(self) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise SwitchUnreachable(
                f"switch {self.switch_name} at {self.address}: no P4Runtime server answered "
                f"within {self.timeout:g} s") from None
        if self.with_stream:
            super().set_up_stream()
        else:  # reads need no arbitration, and so take no election id from anyone
            self.stream_out_q = self.stream_in_q = self.stream_recv_thread = None

    def handshake(self) -> None:
        request = p4runtime_pb2.StreamMessageRequest()
        request.arbitration.device_id = self.device_id
        request.arbitration.election_id.high = self.election_id[0]
        request.arbitration.election_id.low = self.election_id[1]
        self.stream_out_q.put(request)
        reply = self.get_stream_packet("arbitration", timeout=self.timeout)
        if reply is None:
            closed = not self.stream_recv_thread.is_alive()
            self.tear_down()
            if closed:
                raise SwitchError(
                    f"switch {self.switch_name} at {self.address}: the switch closed the "
                    f"stream at arbitration (is election id {self.election_id} already held "
                    "by another controller?)")
            raise SwitchUnreachable(
                f"switch {self.switch_name} at {self.address}: no arbitration answer within "
                f"{self.timeout:g} s")
        if reply.arbitration.status.code != 0 and self.require_primary:
            self.tear_down()
            raise SwitchError(
                f"switch {self.switch_name} at {self.address}: not primary controller "
                f"({reply.arbitration.status.message or reply.arbitration.status.code})")


def update_errors(exc: grpc.RpcError) -> list[tuple[int, p4runtime_pb2.Error]] | None:
    """The refused updates of a failed Write, as (index in the batch, error); None if the
    failure carries no per-update details (the whole call failed)."""
    if exc.code() != grpc.StatusCode.UNKNOWN:
        return None
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            break
    else:
        return None
    errors = []
    for index, detail in enumerate(status.details):
        error = p4runtime_pb2.Error()
        if detail.Unpack(error) and error.canonical_code != code_pb2.OK:
            errors.append((index, error))
    return errors or None


def _tolerated(kind: str, replace: bool, missing_ok: bool) -> int | None:
    """The refusal an idempotent write may meet: an INSERT's entity exists already, a
    DELETE's is gone already."""
    if kind == "INSERT" and replace:
        return code_pb2.ALREADY_EXISTS
    if kind == "DELETE" and missing_ok:
        return code_pb2.NOT_FOUND
    return None


class SwitchSession:
    """A session with one switch: primary (may write) unless ``primary=False`` (a backup
    that keeps a stream, e.g. to notice the switch dying), or ``stream=False``: reads only,
    with no stream and no election id. Election ids must be unique per switch (PI refuses
    a second stream with one already in use), so every role has its own."""

    def __init__(self, name: str, address: str, device_id: int = 1,
                 election_id: tuple[int, int] = (0, 1), timeout: float = 5.0,
                 p4info: P4Info | None = None, primary: bool = True,
                 stream: bool = True) -> None:
        self.name = name
        self.address = address
        self.device_id = device_id
        self.p4info = p4info or built_p4info()
        self.lock = threading.Lock()
        self.client = _Client(name, address, device_id, election_id, timeout,
                              primary and stream, stream)

    # ----------------------------------------------------------------- pipeline
    @property
    def wire(self) -> Wire:
        """The lane width of the pipeline this session speaks (its P4Info's)."""
        return wire(self.p4info.lanes)

    def running_lanes(self) -> int | None:
        """The lane width of the pipeline the switch runs (from its P4Info), or None if it
        runs none."""
        running = self.running_p4info()
        return None if running is None else P4Info(running).lanes

    def push_pipeline(self, force: bool = False) -> bool:
        """Install p4src/build's pipeline of this session's width; False if it was already
        running.

        Not re-pushing a running pipeline matters on BMv2: a re-push keeps BMv2's multicast
        state while PI forgets it, and groups written again would then replicate twice.
        """
        if not force and self.running_p4info() == self.p4info.message:
            return False
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest()
        request.device_id = self.device_id
        request.election_id.high, request.election_id.low = self.client.election_id
        request.action = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
        request.config.p4info.CopyFrom(self.p4info.message)
        request.config.p4_device_config = built_device_config(self.p4info.lanes)
        try:
            self.client.stub.SetForwardingPipelineConfig(request, timeout=30)
        except grpc.RpcError as exc:
            raise SwitchError(f"switch {self.name}: pipeline refused: {exc.details()}") from None
        return True

    def running_p4info(self):
        request = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE)
        try:
            reply = self.client.stub.GetForwardingPipelineConfig(request, timeout=10)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None  # PI's answer for a switch that has no pipeline yet
            raise SwitchError(f"switch {self.name}: cannot read pipeline: {exc.details()}") \
                from None
        return reply.config.p4info if reply.config.HasField("p4info") else None

    # ----------------------------------------------------------------- entries
    def table_entry(self, item: Entry) -> p4runtime_pb2.TableEntry:
        table = self.p4info.table(item.table)
        action = self.p4info.action(item.action)
        message = p4runtime_pb2.TableEntry(table_id=table.id)
        for name, value in item.match:
            field_id, width = table.match_fields[name]
            match = message.match.add(field_id=field_id)
            match.exact.value = encode(value, width)
        message.action.action.action_id = action.id
        for name, value in item.params:
            param_id, width = action.params[name]
            message.action.action.params.add(param_id=param_id, value=encode(value, width))
        return message

    def write_entries(self, items: Iterable[Entry], kind: str = "INSERT",
                      replace: bool = False, missing_ok: bool = False) -> None:
        """Write entries in one batch; a refusal names the switch and the refused entry.

        Made idempotent, for writing again what an interrupted control plane began: with
        ``replace`` an INSERT MODIFYs the entries the switch already holds (ALREADY_EXISTS);
        with ``missing_ok`` a DELETE of entries the switch no longer holds (NOT_FOUND) is
        no error."""
        items = list(items)
        if not items:
            return
        request = p4runtime_pb2.WriteRequest()
        update_type = p4runtime_pb2.Update.Type.Value(kind)
        for item in items:
            update = request.updates.add(type=update_type)
            update.entity.table_entry.CopyFrom(self.table_entry(item))
        existing = self._write(request, [item.describe() for item in items],
                               _tolerated(kind, replace, missing_ok))
        if existing and kind == "INSERT":
            self.write_entries([items[i] for i in existing], "MODIFY")

    def set_multicast_group(self, group_id: int, ports: Iterable[int],
                            kind: str = "INSERT", replace: bool = False,
                            missing_ok: bool = False) -> None:
        """``replace``, ``missing_ok``: as in ``write_entries``."""
        ports = sorted(ports)
        request = p4runtime_pb2.WriteRequest()
        update = request.updates.add(type=p4runtime_pb2.Update.Type.Value(kind))
        group = update.entity.packet_replication_engine_entry.multicast_group_entry
        group.multicast_group_id = group_id
        for instance, port in enumerate(ports):
            group.replicas.add(egress_port=port, instance=instance)
        if (self._write(request, [f"multicast group {group_id} -> ports {ports}"],
                        _tolerated(kind, replace, missing_ok)) and kind == "INSERT"):
            self.set_multicast_group(group_id, ports, "MODIFY")

    def _write(self, request: p4runtime_pb2.WriteRequest, descriptions: list[str],
               tolerated: int | None = None) -> list[int]:
        """Send one write. Updates refused only with the ``tolerated`` code are not an error:
        their indices are returned (the other updates were done)."""
        request.device_id = self.device_id
        request.election_id.high, request.election_id.low = self.client.election_id
        with self.lock:
            try:
                # Not P4RuntimeClient.write: its error parser never ends on a batch where
                # some updates succeeded (it loops on the first OK it meets).
                self.client.stub.Write(request, timeout=30)
            except grpc.RpcError as exc:
                errors = update_errors(exc)
                if errors is None:
                    raise SwitchError(f"switch {self.name}: write failed ({exc.code().name}: "
                                      f"{exc.details()}) for {descriptions[0]}") from None
                codes = {p4_error.canonical_code for _, p4_error in errors}
                if tolerated is not None and codes == {tolerated}:
                    return [index for index, _ in errors]
                lines = [f"  {descriptions[index]}: {p4_error.message or p4_error.canonical_code}"
                         for index, p4_error in errors]
                raise SwitchError(f"switch {self.name} refused {len(lines)} of "
                                  f"{len(descriptions)} writes:\n" + "\n".join(lines)) from None
        return []

    def read_table(self, table: str) -> list[p4runtime_pb2.TableEntry]:
        entity = p4runtime_pb2.Entity()
        entity.table_entry.table_id = self.p4info.table(table).id
        return [e.table_entry for e in self._read(entity)]

    def read_counter(self, name: str) -> list[int]:
        """Packet counts of every cell of an indirect counter."""
        counter_id = self.p4info.counter_id(name)
        entity = p4runtime_pb2.Entity()
        entity.counter_entry.counter_id = counter_id
        size = self.p4info.counters[name][1]
        cells = [0] * size
        for reply in self._read(entity):
            cells[reply.counter_entry.index.index] = reply.counter_entry.data.packet_count
        return cells

    def _read(self, entity: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        request.entities.add().CopyFrom(entity)
        try:
            with self.lock:
                return [e for reply in self.client.stub.Read(request, timeout=10)
                        for e in reply.entities]
        except grpc.RpcError as exc:
            raise SwitchError(f"switch {self.name}: read failed ({exc.code().name}: "
                              f"{exc.details()})") from None

    # ----------------------------------------------------------------- packets, health
    def packet_out(self, frame: bytes) -> None:
        """Inject a frame at the CPU port (the pipeline checks the controller magic)."""
        request = p4runtime_pb2.StreamMessageRequest()
        request.packet.payload = frame
        metadata_id, width = self.p4info.packet_out_metadata["magic"]
        request.packet.metadata.add(metadata_id=metadata_id,
                                    value=encode(CONTROLLER_MAGIC, width))
        self.client.stream_out_q.put(request)

    def stream_alive(self) -> bool:
        thread = self.client.stream_recv_thread
        return thread is not None and thread.is_alive()

    def ping(self, timeout: float = 1.0) -> None:
        """One bounded round trip; raises SwitchUnreachable if the switch does not answer."""
        try:
            self.client.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise SwitchUnreachable(f"switch {self.name} at {self.address}: "
                                    f"{exc.code().name}") from None

    def close(self) -> None:
        try:
            self.client.tear_down()
        except Exception:
            pass


__all__ = ["Entry", "P4RuntimeException", "SwitchError", "SwitchSession", "SwitchUnreachable",
           "encode", "entry"]
