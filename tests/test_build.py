"""The committed p4src/build matches the P4 sources it was generated from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from bml.paths import BUILD_DIR, REPO_ROOT
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


def local_p4c() -> str | None:
    for candidate in (os.environ.get("P4C"), shutil.which("p4c-bm2-ss"),
                      "/opt/p4c/bin/p4c-bm2-ss"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.skipif(local_p4c() is None, reason="p4c-bm2-ss is not installed (p4c is in no "
                    "package registry; set P4C to a local build to run this)")
def test_p4c_reproduces_the_committed_build(tmp_path):
    """`make build`'s script, compiling into a scratch folder, gives the committed bytes."""
    done = subprocess.run(["bash", "tools/build_p4.sh"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "P4C": local_p4c(), "BML_BUILD_OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    for name in ("bml.json", "bml.p4info.txtpb", "p4src.sha256"):
        assert (tmp_path / name).read_bytes() == (BUILD_DIR / name).read_bytes(), name
