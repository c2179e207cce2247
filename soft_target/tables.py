"""How the software target holds a P4 table, so that each table is declared once.

Every control module declares its tables in ``TABLES``, keyed by the P4 name the control plane
also uses (``control_plane.p4info.Names``). The P4Runtime server and the simulator compile
entries through that one declaration; key order, parameter names and widths come from the
P4Info, not restated here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from control_plane.p4info import built_p4info

Key = tuple[int, ...]  # match fields in the P4Info's order
Params = tuple[int, ...]  # action parameters in the P4Info's order
Row = tuple[Key, str, Params]  # one entry: key, action name, parameters


@dataclass(frozen=True)
class SoftTable:
    """One P4 table as the pipeline holds it: the ``Tables`` attribute its entries become,
    compiled whole from all of them on every write (so the packet loop never sees a half-written
    table). A table whose default action decides a packet's fate (the callers of the others
    only test hit, as in p4src) also names the attribute its default entry becomes."""

    attribute: str
    compile: Callable[[list[Row]], dict]
    default_attribute: str | None = None
    compile_default: Callable[[str, Params], object] | None = None


def named_params(action: str, params: Params) -> dict[str, int]:
    """``params`` by the names the P4Info gives the action's parameters."""
    return dict(zip(built_p4info().action(action).params, params, strict=True))


def byte_params(action: str, params: Params) -> dict[str, bytes]:
    """``params`` by name, each as big-endian bytes as wide as the P4Info says."""
    info = built_p4info().action(action).params
    return {name: value.to_bytes(width // 8, "big")
            for (name, (_, width)), value in zip(info.items(), params, strict=True)}


def port_by_key(rows: list[Row]) -> dict[Key, int]:
    """A table whose one action takes the ``port`` to use: the whole key -> that port."""
    return {key: named_params(action, params)["port"] for key, action, params in rows}
