"""The compiled pipelines in ``p4src/build``: where they live, and name-to-id look-ups in a P4Info.

Both the control plane (to build P4Runtime messages) and the software target (to understand
them) read the P4Info through this one class, so neither hard-codes an id. There is one build
per lane width (``bml.protocol.BUILT_LANES``), in ``p4src/build/lanes<N>/``; a P4Info says its
width (``P4Info.lanes``: one register per lane), so nobody assumes one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from bml.paths import BUILD_DIR, P4SRC_DIR
from bml.protocol import BUILT_LANES, DEFAULT_LANES

LANE_REGISTER_PREFIX = "sum_"  # aggregation.p4: one register array per lane, sum_<block>_<lane>


def build_dir(lanes: int = DEFAULT_LANES) -> Path:
    """Where p4c's output for the ``lanes``-wide build is."""
    return BUILD_DIR / f"lanes{lanes}"


def p4info_path(lanes: int = DEFAULT_LANES) -> Path:
    return build_dir(lanes) / "bml.p4info.txtpb"


def bmv2_json_path(lanes: int = DEFAULT_LANES) -> Path:
    return build_dir(lanes) / "bml.json"


def source_hash_path(lanes: int = DEFAULT_LANES) -> Path:
    return build_dir(lanes) / "p4src.sha256"


def p4_sources() -> list[Path]:
    """Every P4 source file that the build depends on, in a stable order."""
    return sorted(p for p in P4SRC_DIR.rglob("*.p4") if BUILD_DIR not in p.parents)


def p4_source_hash() -> str:
    """SHA-256 of the ``sha256sum`` listing of the P4 sources (relative paths, sorted).

    The same as ``(cd p4src && find . -name '*.p4' -not -path './build/*' | sed 's|^./||' |
    LC_ALL=C sort | xargs sha256sum) | sha256sum``, so a p4c container without Python can
    record it too."""
    listing = "".join(
        f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(P4SRC_DIR)}\n"
        for path in sorted(p4_sources(), key=lambda p: str(p.relative_to(P4SRC_DIR))))
    return hashlib.sha256(listing.encode()).hexdigest()


class PipelineNotBuilt(RuntimeError):
    pass


@dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    match_fields: dict[str, tuple[int, int]]  # name -> (field id, bitwidth), in key order
    actions: dict[str, int]  # action name -> action id


@dataclass(frozen=True)
class ActionInfo:
    id: int
    name: str
    params: dict[str, tuple[int, int]]  # name -> (param id, bitwidth), in order


class P4Info:
    """Index of a P4Info message by the names used in the P4 program."""

    def __init__(self, message: p4info_pb2.P4Info) -> None:
        self.message = message
        self.actions: dict[str, ActionInfo] = {}
        self.action_by_id: dict[int, ActionInfo] = {}
        for action in message.actions:
            info = ActionInfo(
                action.preamble.id,
                action.preamble.name,
                {p.name: (p.id, p.bitwidth) for p in action.params},
            )
            self.actions[info.name] = info
            self.action_by_id[info.id] = info
        self.tables: dict[str, TableInfo] = {}
        self.table_by_id: dict[int, TableInfo] = {}
        for table in message.tables:
            info = TableInfo(
                table.preamble.id,
                table.preamble.name,
                {m.name: (m.id, m.bitwidth) for m in table.match_fields},
                {self.action_by_id[ref.id].name: ref.id for ref in table.action_refs},
            )
            self.tables[info.name] = info
            self.table_by_id[info.id] = info
        self.counters: dict[str, tuple[int, int]] = {
            c.preamble.name: (c.preamble.id, c.size) for c in message.counters
        }
        self.counter_by_id = {cid: name for name, (cid, _) in self.counters.items()}
        self.lanes = sum(1 for r in message.registers
                         if r.preamble.name.rpartition(".")[2].startswith(LANE_REGISTER_PREFIX))
        self.packet_out_metadata: dict[str, tuple[int, int]] = {}
        for header in message.controller_packet_metadata:
            if header.preamble.name == "packet_out":
                self.packet_out_metadata = {m.name: (m.id, m.bitwidth) for m in header.metadata}

    def table(self, name: str) -> TableInfo:
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"no table {name!r} in the P4Info") from None

    def action(self, name: str) -> ActionInfo:
        try:
            return self.actions[name]
        except KeyError:
            raise KeyError(f"no action {name!r} in the P4Info") from None

    def counter_id(self, name: str) -> int:
        try:
            return self.counters[name][0]
        except KeyError:
            raise KeyError(f"no counter {name!r} in the P4Info") from None


def parse_p4info_text(text: str) -> p4info_pb2.P4Info:
    message = p4info_pb2.P4Info()
    text_format.Merge(text, message)
    return message


def _check_width(lanes: int) -> None:
    if lanes not in BUILT_LANES:
        raise PipelineNotBuilt(f"no {lanes}-lane build: p4src/build holds "
                               f"{', '.join(map(str, BUILT_LANES))} lanes")


@cache
def built_p4info(lanes: int = DEFAULT_LANES) -> P4Info:
    """The P4Info that p4c produced for ``p4src/`` at ``lanes``."""
    _check_width(lanes)
    path = p4info_path(lanes)
    if not path.exists():
        raise PipelineNotBuilt(f"{path} is missing: run `make build`")
    return P4Info(parse_p4info_text(path.read_text()))


@cache
def built_device_config(lanes: int = DEFAULT_LANES) -> bytes:
    """The BMv2 JSON that p4c produced at ``lanes``; the software target accepts exactly
    these bytes."""
    _check_width(lanes)
    path = bmv2_json_path(lanes)
    if not path.exists():
        raise PipelineNotBuilt(f"{path} is missing: run `make build`")
    return path.read_bytes()


class Names:
    """Fully qualified names of the P4 objects the control plane programs (see p4src/)."""

    L2_FORWARD = "BmlIngress.forwarding.l2_forward"
    FORWARD_TO = "BmlIngress.forwarding.forward_to"
    JOB_CONFIG = "BmlIngress.admission.job_config"
    SET_JOB = "BmlIngress.admission.set_job"
    WORKER_ADMISSION = "BmlIngress.admission.worker_admission"
    ADMIT = "BmlIngress.admission.admit"
    OWNER_ROUTE = "BmlIngress.result_routing.owner_route"
    ROUTE_TO_OWNER = "BmlIngress.result_routing.route_to_owner"
    HOST_ADDRESS = "BmlEgress.egress_rewrite.host_address"
    SET_HOST_ADDRESS = "BmlEgress.egress_rewrite.set_host_address"
    STATS = "BmlIngress.stats"
    DROPS = "BmlIngress.drops"
    UNADDRESSED = "BmlEgress.egress_rewrite.unaddressed"
