"""The committed p4src/build matches the P4 sources it was generated from."""

from __future__ import annotations

import json

from control_plane.p4info import (
    BMV2_JSON_PATH,
    P4INFO_PATH,
    SOURCE_HASH_PATH,
    Names,
    built_p4info,
    p4_source_hash,
)


def test_build_is_current():
    assert SOURCE_HASH_PATH.exists(), "p4src/build is missing: run `make build`"
    recorded = SOURCE_HASH_PATH.read_text().split()[0]
    assert recorded == p4_source_hash(), (
        "the P4 sources changed since p4src/build was generated: run `make build` and commit "
        "p4src/build")


def test_build_artifacts_are_real_p4c_output():
    program = json.loads(BMV2_JSON_PATH.read_text())
    assert program["__meta__"]["compiler"].endswith("p4c") or "p4c" in str(program["__meta__"])
    register_names = {r["name"] for r in program["register_arrays"]}
    assert "BmlIngress.aggregation.worker_bitmap" in register_names
    assert sum(1 for name in register_names if ".sum_" in name) == 64
    assert P4INFO_PATH.read_text().startswith("# proto-file: p4/config/v1/p4info.proto")


def test_every_name_the_control_plane_uses_is_in_the_p4info():
    p4info = built_p4info()
    for attribute, name in vars(Names).items():
        if attribute.startswith("_"):
            continue
        assert (name in p4info.tables or name in p4info.actions
                or name in p4info.counters), name
    assert "magic" in p4info.packet_out_metadata
