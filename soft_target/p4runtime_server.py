"""P4Runtime over gRPC for the software target: the subset the control plane uses.

Served: Capabilities; StreamChannel (arbitration, PacketOut); Set/GetForwardingPipelineConfig
(only a P4Info and BMv2 JSON of one of the builds in ``p4src/build`` are accepted, and the
pipeline takes that build's lane width); Write and Read of table
entries, multicast groups and counters. Errors follow PI's conventions (a Write error is
gRPC UNKNOWN with one ``p4.v1.Error`` per update), so p4runtime-shell's error parsing and the
control plane behave the same against this server and against simple_switch_grpc. As in PI,
register entries are not served.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import replace

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from bml.paths import REPO_ROOT
from bml.protocol import BUILT_LANES, CPU_PORT
from control_plane.p4info import (
    LANE_REGISTER_PREFIX,
    Names,
    P4Info,
    PipelineNotBuilt,
    build_dir,
    built_device_config,
    built_p4info,
)
from soft_target.pipeline import TABLES, Pipeline
from soft_target.tables import Row

log = logging.getLogger(__name__)
API_VERSION = "1.4.1"
# gRPC's default 4 MB is less than the widest build's device config (its BMv2 JSON: 33 MB).
MAX_MESSAGE_BYTES = 256 << 20
Key = tuple[int, ...]


_ELECTION_TAKEN = object()  # StreamChannel's marker: this stream asked for a taken election id


class WriteError(Exception):
    """One update refused, with the canonical code the client will see."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _int(data: bytes, bitwidth: int, what: str) -> int:
    """A key or parameter value, as PI reads it: padded bytes are fine, no bytes are 0, a
    value wider than its field is INVALID_ARGUMENT."""
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise WriteError(code_pb2.INVALID_ARGUMENT,
                         f"{what}: {data!r} does not fit in {bitwidth} bits")
    return value


def _compile_table(name: str, rows: list[Row]) -> dict:
    """The pipeline's dict for one table, from (key, action name, params) rows, as the control
    that holds the table declares it (``soft_target.pipeline.TABLES``)."""
    table = TABLES.get(name)
    if table is None:
        raise WriteError(code_pb2.NOT_FOUND,
                         f"table {name} is not served by the software target")
    return table.compile(rows)


def _initial_defaults(p4info: P4Info, lanes: int) -> dict[int, p4runtime_pb2.TableEntry]:
    """Each table's default entry as the P4 program sets it (the BMv2 JSON holds it; the
    P4Info does not), the way PI reads it back."""
    program = json.loads(built_device_config(lanes))
    names = {action["id"]: action["name"] for action in program["actions"]}
    defaults = {}
    for pipe in program["pipelines"]:
        for table in pipe["tables"]:
            if table["name"] not in p4info.tables:
                continue
            entry = p4runtime_pb2.TableEntry(table_id=p4info.table(table["name"]).id,
                                             is_default_action=True)
            entry.action.action.action_id = p4info.action(
                names[table["default_entry"]["action_id"]]).id
            defaults[entry.table_id] = entry
    return defaults


_TABLE_ATTRIBUTE = {name: table.attribute for name, table in TABLES.items()}


def _lanes_of(p4info) -> int:
    """The width a P4Info message claims (P4Info.lanes' rule), read without indexing it."""
    return sum(1 for r in p4info.registers
               if r.preamble.name.rpartition(".")[2].startswith(LANE_REGISTER_PREFIX))


def _built_width(config) -> int | str:
    """The width of the build whose P4Info and device config ``config`` holds, or why none."""
    lanes = _lanes_of(config.p4info)
    if lanes not in BUILT_LANES:
        return (f"the P4Info has {lanes} lane registers, and p4src/build holds "
                f"{', '.join(map(str, BUILT_LANES))}-lane builds")
    try:
        reference, device_config = built_p4info(lanes), built_device_config(lanes)
    except PipelineNotBuilt as exc:
        return str(exc)
    where = build_dir(lanes).relative_to(REPO_ROOT)
    if config.p4info != reference.message:
        return f"the P4Info differs from {where}/bml.p4info.txtpb"
    if config.p4_device_config != device_config:
        return f"the device config differs from {where}/bml.json"
    return lanes


class SoftP4RuntimeServicer(p4runtime_pb2_grpc.P4RuntimeServicer):
    """Holds the P4Runtime view of one switch and applies it to its ``Pipeline``.

    ``run_in_loop`` hands a callable to the thread that owns the pipeline, so that packet-outs
    and pipeline resets never interleave with a packet being processed.
    """

    def __init__(self, pipeline: Pipeline, device_id: int,
                 run_in_loop: Callable[[Callable[[], None]], None],
                 transmit: Callable[[list[tuple[int, bytes]]], None]) -> None:
        self.pipeline = pipeline
        self.device_id = device_id
        self.run_in_loop = run_in_loop
        self.transmit = transmit
        self.p4info: P4Info | None = None
        self.cookie = 0
        self.lock = threading.Lock()
        self.entries: dict[int, dict[Key, p4runtime_pb2.TableEntry]] = {}
        self.defaults: dict[int, p4runtime_pb2.TableEntry] = {}  # table id -> default entry
        self.groups: dict[int, p4runtime_pb2.MulticastGroupEntry] = {}
        self.elections: dict[int, tuple[int, int]] = {}  # stream id -> election id
        self.next_stream = 0

    # ---------------------------------------------------------------- helpers
    def _check_device(self, device_id: int, context: grpc.ServicerContext) -> None:
        if device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"device {device_id} is not here (this is device {self.device_id})")

    def _primary(self) -> tuple[int, int] | None:
        return max(self.elections.values(), default=None)

    def _check_primary(self, election_id: p4runtime_pb2.Uint128,
                       context: grpc.ServicerContext) -> None:
        if self._primary() != (election_id.high, election_id.low):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          "not the primary controller (open a StreamChannel with the highest "
                          "election id first)")

    def _require_pipeline(self, context: grpc.ServicerContext) -> P4Info:
        if self.p4info is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "no forwarding pipeline config set")
        return self.p4info

    # ---------------------------------------------------------------- RPCs
    def Capabilities(self, request, context):  # noqa: N802 (gRPC method names)
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    def SetForwardingPipelineConfig(self, request, context):  # noqa: N802
        self._check_device(request.device_id, context)
        self._check_primary(request.election_id, context)
        action = request.action
        actions = p4runtime_pb2.SetForwardingPipelineConfigRequest
        if action not in (actions.VERIFY, actions.VERIFY_AND_COMMIT, actions.COMMIT,
                          actions.RECONCILE_AND_COMMIT):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported action {action}")
        lanes = _built_width(request.config)
        if action == actions.COMMIT and not isinstance(lanes, int):
            lanes = self.pipeline.lanes  # a config given before (none: the default build)
        if not isinstance(lanes, int):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"this software target runs only the BML-INA pipeline: {lanes}")
        if action == actions.VERIFY:
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        reference = built_p4info(lanes)
        with self.lock:
            self.p4info = reference
            self.cookie = request.config.cookie.cookie
            self.entries = {t.id: {} for t in reference.tables.values()}
            self.defaults = _initial_defaults(reference, lanes)
            self.groups = {}
            done = threading.Event()

            def reset() -> None:
                self.pipeline.__init__(lanes=lanes)
                done.set()

            self.run_in_loop(reset)
            if not done.wait(10):
                context.abort(grpc.StatusCode.INTERNAL, "packet loop did not take the pipeline")
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):  # noqa: N802
        self._check_device(request.device_id, context)
        response = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        if self.p4info is None:  # PI's answer, word for word
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "No forwarding pipeline config set for this device")
        kinds = p4runtime_pb2.GetForwardingPipelineConfigRequest
        if request.response_type in (kinds.ALL, kinds.P4INFO_AND_COOKIE):
            response.config.p4info.CopyFrom(self.p4info.message)
        if request.response_type in (kinds.ALL, kinds.DEVICE_CONFIG_AND_COOKIE):
            response.config.p4_device_config = built_device_config(self.p4info.lanes)
        response.config.cookie.cookie = self.cookie
        return response

    def Write(self, request, context):  # noqa: N802
        self._check_device(request.device_id, context)
        self._check_primary(request.election_id, context)
        p4info = self._require_pipeline(context)
        errors = []
        with self.lock:
            touched: set[int] = set()
            groups_touched = False
            for update in request.updates:
                try:
                    entity = update.entity
                    kind = entity.WhichOneof("entity")
                    if kind == "table_entry":
                        touched.add(self._write_table_entry(p4info, update.type,
                                                            entity.table_entry))
                    elif kind == "packet_replication_engine_entry":
                        self._write_group(update.type, entity.packet_replication_engine_entry)
                        groups_touched = True
                    else:
                        raise WriteError(code_pb2.UNIMPLEMENTED,
                                         f"writing {kind} is not supported")
                    errors.append(p4runtime_pb2.Error(canonical_code=code_pb2.OK))
                except WriteError as exc:
                    errors.append(p4runtime_pb2.Error(canonical_code=exc.code,
                                                      message=str(exc)))
            self._apply(p4info, touched, groups_touched)
        failed = [e for e in errors if e.canonical_code != code_pb2.OK]
        if failed:
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message=failed[0].message)
            for error in errors:
                status.details.add().Pack(error)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),))
            context.set_code(grpc.StatusCode.UNKNOWN)
            context.set_details(f"{len(failed)} of {len(errors)} updates failed: "
                                f"{failed[0].message}")
        return p4runtime_pb2.WriteResponse()

    def Read(self, request, context):  # noqa: N802
        self._check_device(request.device_id, context)
        p4info = self._require_pipeline(context)
        response = p4runtime_pb2.ReadResponse()
        with self.lock:
            for entity in request.entities:
                kind = entity.WhichOneof("entity")
                if kind == "table_entry":
                    self._read_table_entries(entity.table_entry, response)
                elif kind == "counter_entry":
                    self._read_counters(p4info, entity.counter_entry, response, context)
                elif kind == "packet_replication_engine_entry":
                    wanted = entity.packet_replication_engine_entry.multicast_group_entry
                    for gid, group in sorted(self.groups.items()):
                        if wanted.multicast_group_id in (0, gid):
                            response.entities.add().packet_replication_engine_entry \
                                .multicast_group_entry.CopyFrom(group)
                else:
                    context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                  f"reading {kind} is not supported")
        yield response

    def StreamChannel(self, request_iterator, context):  # noqa: N802
        outgoing: queue.Queue = queue.Queue()
        with self.lock:
            stream = self.next_stream
            self.next_stream += 1

        def read_requests() -> None:
            try:
                for request in request_iterator:
                    kind = request.WhichOneof("update")
                    if kind == "arbitration":
                        election = (request.arbitration.election_id.high,
                                    request.arbitration.election_id.low)
                        with self.lock:
                            taken = any(other != stream and held == election
                                        for other, held in self.elections.items())
                        if taken:  # as PI: the stream ends with INVALID_ARGUMENT
                            outgoing.put(_ELECTION_TAKEN)
                            return
                        outgoing.put(self._arbitrate(stream, request.arbitration))
                    elif kind == "packet":
                        with self.lock:
                            election = self.elections.get(stream)
                            primary = election is not None and election == self._primary()
                        if primary:  # as PI: a backup's (or a stranger's) packet is dropped
                            self._packet_out(request.packet)
            except grpc.RpcError:
                pass
            finally:
                with self.lock:
                    self.elections.pop(stream, None)
                outgoing.put(None)

        threading.Thread(target=read_requests, daemon=True, name=f"p4rt-stream-{stream}").start()
        while True:
            message = outgoing.get()
            if message is None:
                return
            if message is _ELECTION_TAKEN:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Election id already exists")
            yield message

    # ---------------------------------------------------------------- internals
    def _arbitrate(self, stream: int, arbitration) -> p4runtime_pb2.StreamMessageResponse:
        response = p4runtime_pb2.StreamMessageResponse()
        response.arbitration.device_id = arbitration.device_id
        response.arbitration.election_id.CopyFrom(arbitration.election_id)
        if arbitration.device_id != self.device_id:
            response.arbitration.status.code = code_pb2.NOT_FOUND
            response.arbitration.status.message = f"this is device {self.device_id}"
            return response
        with self.lock:
            self.elections[stream] = (arbitration.election_id.high, arbitration.election_id.low)
            primary = self._primary() == self.elections[stream]
        response.arbitration.status.code = code_pb2.OK if primary else code_pb2.ALREADY_EXISTS
        response.arbitration.status.message = "Is primary" if primary else "Is backup"  # as PI
        return response

    def _packet_out(self, packet: p4runtime_pb2.PacketOut) -> None:
        p4info = self.p4info
        if p4info is None:
            return
        header = 0
        width = 0
        values = {m.metadata_id: m.value for m in packet.metadata}
        for name, (mid, bitwidth) in p4info.packet_out_metadata.items():
            value = int.from_bytes(values.get(mid, b""), "big")  # missing: 0, as in PI
            if value >> bitwidth:  # as PI: a value wider than its field drops the packet
                log.info("packet-out dropped: %s = %#x does not fit in %d bits", name,
                         value, bitwidth)
                return
            header = (header << bitwidth) | value
            width += bitwidth
        frame = header.to_bytes(width // 8, "big") + packet.payload
        self.run_in_loop(lambda: self.transmit(self.pipeline.process(CPU_PORT, frame)))

    def _write_table_entry(self, p4info: P4Info, update_type: int,
                           entry: p4runtime_pb2.TableEntry) -> int:
        table = p4info.table_by_id.get(entry.table_id)
        if table is None:
            raise WriteError(code_pb2.NOT_FOUND, f"unknown table id {entry.table_id}")
        if entry.is_default_action:
            return self._write_default(p4info, table, update_type, entry)
        if entry.priority:
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"{table.name}: an exact-match table takes no priority")
        key = self._key(table, entry)
        rows = self.entries[table.id]
        types = p4runtime_pb2.Update
        what = f"{table.name} entry {key}"
        if update_type == types.INSERT:
            if key in rows:
                raise WriteError(code_pb2.ALREADY_EXISTS, f"{what} already exists")
        elif update_type in (types.MODIFY, types.DELETE):
            if key not in rows:
                raise WriteError(code_pb2.NOT_FOUND, f"{what} does not exist")
            if update_type == types.DELETE:
                del rows[key]
                return table.id
        else:
            raise WriteError(code_pb2.INVALID_ARGUMENT, f"bad update type {update_type}")
        self._action(p4info, table, entry)  # validates
        stored = p4runtime_pb2.TableEntry()
        stored.CopyFrom(entry)
        rows[key] = stored
        return table.id

    def _write_default(self, p4info: P4Info, table, update_type: int,
                       entry: p4runtime_pb2.TableEntry) -> int:
        """As PI: the default entry is only modified; with no action it goes back to the
        program's."""
        if update_type != p4runtime_pb2.Update.MODIFY:
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"Cannot use {p4runtime_pb2.Update.Type.Name(update_type)} for "
                             "default entry")
        if entry.match or entry.priority:
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"{table.name}: a default entry has no match and no priority")
        if not entry.HasField("action"):
            self.defaults[table.id] = _initial_defaults(p4info, p4info.lanes)[table.id]
            return table.id
        self._action(p4info, table, entry, default=True)  # validates
        stored = p4runtime_pb2.TableEntry()
        stored.CopyFrom(entry)
        self.defaults[table.id] = stored
        return table.id

    @staticmethod
    def _key(table, entry: p4runtime_pb2.TableEntry) -> Key:
        by_id = {fid: (name, width) for name, (fid, width) in table.match_fields.items()}
        given = {}
        for match in entry.match:
            if match.field_id not in by_id:
                raise WriteError(code_pb2.INVALID_ARGUMENT,
                                 f"{table.name}: unknown match field id {match.field_id}")
            if match.WhichOneof("field_match_type") != "exact":
                raise WriteError(code_pb2.INVALID_ARGUMENT,
                                 f"{table.name}: match fields are exact")
            name, width = by_id[match.field_id]
            given[match.field_id] = _int(match.exact.value, width, f"{table.name}.{name}")
        missing = [name for name, (fid, _) in table.match_fields.items() if fid not in given]
        if missing:
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"{table.name}: missing match field(s) {', '.join(missing)}")
        return tuple(given[fid] for fid, _ in table.match_fields.values())

    @staticmethod
    def _action(p4info: P4Info, table, entry: p4runtime_pb2.TableEntry,
                default: bool = False) -> tuple[str, tuple]:
        if entry.action.WhichOneof("type") != "action":
            raise WriteError(code_pb2.INVALID_ARGUMENT, f"{table.name}: a direct action is needed")
        action_id = entry.action.action.action_id
        action = p4info.action_by_id.get(action_id)
        if action is None or action.name not in table.actions:
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"{table.name}: action id {action_id} is not an action of this table")
        scope = {ref.id: ref.scope for t in p4info.message.tables if t.preamble.id == table.id
                 for ref in t.action_refs}
        if scope.get(action_id) == (1 if default else 2):  # TABLE_ONLY, DEFAULT_ONLY
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"{table.name}: {action.name} cannot be used here")
        given = {p.param_id: p.value for p in entry.action.action.params}
        params = []
        for name, (pid, width) in action.params.items():
            if pid not in given:
                raise WriteError(code_pb2.INVALID_ARGUMENT,
                                 f"{table.name}: {action.name} needs parameter {name}")
            params.append(_int(given[pid], width, f"{action.name}.{name}"))
        if len(given) != len(action.params):
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"{table.name}: {action.name} got unknown parameters")
        return action.name, tuple(params)

    def _write_group(self, update_type: int, pre: p4runtime_pb2.PacketReplicationEngineEntry):
        if pre.WhichOneof("type") != "multicast_group_entry":
            raise WriteError(code_pb2.UNIMPLEMENTED, "only multicast groups are supported")
        group = pre.multicast_group_entry
        gid = group.multicast_group_id
        if gid == 0:
            raise WriteError(code_pb2.INVALID_ARGUMENT, "multicast group id 0 is reserved")
        types = p4runtime_pb2.Update
        if update_type == types.INSERT and gid in self.groups:
            raise WriteError(code_pb2.ALREADY_EXISTS, f"multicast group {gid} already exists")
        if update_type in (types.MODIFY, types.DELETE) and gid not in self.groups:
            raise WriteError(code_pb2.NOT_FOUND, f"multicast group {gid} does not exist")
        if update_type == types.DELETE:
            del self.groups[gid]
            return
        replicas = [(self._replica_port(r), r.instance) for r in group.replicas]
        if len(set(replicas)) != len(replicas):
            raise WriteError(code_pb2.INVALID_ARGUMENT,
                             f"multicast group {gid}: a replica (port, instance) given twice")
        stored = p4runtime_pb2.MulticastGroupEntry()
        stored.CopyFrom(group)
        self.groups[gid] = stored

    @staticmethod
    def _replica_port(replica: p4runtime_pb2.Replica) -> int:
        if replica.WhichOneof("port_kind") == "port":
            return int.from_bytes(replica.port, "big")
        return replica.egress_port

    def _apply(self, p4info: P4Info, touched: set[int], groups_touched: bool) -> None:
        """Swap the pipeline's dicts for freshly compiled ones (one assignment each)."""
        changes = {}
        for table_id in touched:
            table = p4info.table_by_id[table_id]
            rows = [(key, *self._action(p4info, table, entry))
                    for key, entry in self.entries[table_id].items()]
            changes[_TABLE_ATTRIBUTE[table.name]] = _compile_table(table.name, rows)
            soft = TABLES[table.name]
            if soft.default_attribute is not None:  # a default that decides a packet's fate
                name, params = self._action(p4info, table, self.defaults[table_id],
                                            default=True)
                changes[soft.default_attribute] = soft.compile_default(name, params)
        if groups_touched:
            changes["mcast_groups"] = {
                gid: tuple(self._replica_port(r) for r in group.replicas)
                for gid, group in self.groups.items()
            }
        if changes:
            self.pipeline.tables = replace(self.pipeline.tables, **changes)

    def _read_table_entries(self, wanted: p4runtime_pb2.TableEntry,
                            response: p4runtime_pb2.ReadResponse) -> None:
        for table_id, rows in sorted(self.entries.items()):
            if wanted.table_id not in (0, table_id):
                continue
            if wanted.is_default_action:  # as PI: the default entry alone, never in wildcards
                response.entities.add().table_entry.CopyFrom(self.defaults[table_id])
                continue
            for entry in rows.values():
                if wanted.match and list(wanted.match) != list(entry.match):
                    continue
                response.entities.add().table_entry.CopyFrom(entry)

    def _read_counters(self, p4info: P4Info, wanted: p4runtime_pb2.CounterEntry,
                       response: p4runtime_pb2.ReadResponse, context) -> None:
        arrays = {Names.STATS: self.pipeline.stats, Names.DROPS: self.pipeline.drops,
                  Names.UNADDRESSED: self.pipeline.unaddressed}
        for name, (counter_id, size) in p4info.counters.items():
            if wanted.counter_id not in (0, counter_id):
                continue
            values = arrays[name]
            indices = [wanted.index.index] if wanted.HasField("index") else range(size)
            for index in indices:
                if index >= size:  # PI's code for it
                    context.abort(grpc.StatusCode.UNKNOWN,
                                  f"{name} has {size} cells, no index {index}")
                entry = response.entities.add().counter_entry
                entry.counter_id = counter_id
                entry.index.index = index
                entry.data.packet_count = values[index]
        if wanted.counter_id and wanted.counter_id not in p4info.counter_by_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown counter id {wanted.counter_id}")


def serve(servicer: SoftP4RuntimeServicer, address: str) -> tuple[grpc.Server, int]:
    """Start the gRPC server on ``address`` (host:port, port 0 = any); returns it and its
    port. Raises OSError if the address cannot be bound."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen for P4Runtime on {address}")
    server.start()
    return server, port

