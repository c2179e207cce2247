"""The committed p4src/build matches the P4 sources it was generated from, at every width."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from bml.paths import BUILD_DIR, REPO_ROOT
from bml.protocol import BUILT_LANES, DEFAULT_LANES, LANES_PER_BLOCK
from control_plane.p4info import (
    Names,
    bmv2_json_path,
    build_dir,
    built_p4info,
    p4_source_hash,
    p4info_path,
    source_hash_path,
)

WIDTHS = [pytest.param(lanes, id=f"lanes{lanes}") for lanes in BUILT_LANES]


@pytest.mark.parametrize("lanes", WIDTHS)
def test_build_is_current(lanes):
    path = source_hash_path(lanes)
    assert path.exists(), f"{build_dir(lanes)} is missing: run `make build`"
    recorded = path.read_text().split()[0]
    assert recorded == p4_source_hash(), (
        f"the P4 sources changed since {build_dir(lanes)} was generated: run `make build` and "
        "commit p4src/build")


def test_build_holds_every_width_and_nothing_else():
    assert sorted(p.name for p in BUILD_DIR.iterdir()) == sorted(
        f"lanes{lanes}" for lanes in BUILT_LANES)
    script = (REPO_ROOT / "tools" / "build_p4.sh").read_text()
    listed = re.search(r'^BUILT_LANES="([\d ]+)"', script, re.M).group(1)
    assert tuple(int(n) for n in listed.split()) == BUILT_LANES


@pytest.mark.parametrize("lanes", WIDTHS)
def test_build_artifacts_are_real_p4c_output_of_their_width(lanes):
    program = json.loads(bmv2_json_path(lanes).read_text())
    assert program["__meta__"]["compiler"].endswith("p4c") or "p4c" in str(program["__meta__"])
    register_names = {r["name"] for r in program["register_arrays"]}
    assert "BmlIngress.aggregation.worker_bitmap" in register_names
    assert sum(1 for name in register_names if ".sum_" in name) == lanes
    blocks = lanes // LANES_PER_BLOCK
    headers = {h["name"]: h["header_type"] for h in program["headers"]}
    assert [name for name, kind in headers.items() if kind == "values_t"] == [
        f"b{i:02d}" for i in range(blocks)]
    values_t = next(t for t in program["header_types"] if t["name"] == "values_t")
    assert [(f[0], f[1]) for f in values_t["fields"]] == [
        (f"v{i:02d}", 32) for i in range(LANES_PER_BLOCK)]
    assert p4info_path(lanes).read_text().startswith("# proto-file: p4/config/v1/p4info.proto")
    assert built_p4info(lanes).lanes == lanes


@pytest.mark.parametrize("lanes", WIDTHS)
def test_every_name_the_control_plane_uses_is_in_the_p4info(lanes):
    p4info = built_p4info(lanes)
    for attribute, name in vars(Names).items():
        if attribute.startswith("_"):
            continue
        assert (name in p4info.tables or name in p4info.actions
                or name in p4info.counters), name
    assert "magic" in p4info.packet_out_metadata


def test_widths_differ_only_in_the_lanes():
    """Tables, actions and counters (what the control plane programs) are the same in every
    build, ids included: only the lane registers and headers differ."""
    default = built_p4info(DEFAULT_LANES)
    for lanes in BUILT_LANES:
        other = built_p4info(lanes)
        assert other.message.tables == default.message.tables
        assert other.message.actions == default.message.actions
        assert other.message.counters == default.message.counters
        assert other.message.controller_packet_metadata == \
            default.message.controller_packet_metadata


def local_p4c() -> str | None:
    for candidate in (os.environ.get("P4C"), shutil.which("p4c-bm2-ss"),
                      "/opt/p4c/bin/p4c-bm2-ss"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.skipif(local_p4c() is None, reason="p4c-bm2-ss is not installed (p4c is in no "
                    "package registry; set P4C to a local build to run this)")
def test_p4c_reproduces_the_committed_build(tmp_path):
    """`make build`'s script, compiling the default width into a scratch folder, gives the
    committed bytes (the wide builds take minutes; they are held by the hash and the checks
    above)."""
    done = subprocess.run(["bash", "tools/build_p4.sh", str(DEFAULT_LANES)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "P4C": local_p4c(), "BML_BUILD_OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    for name in ("bml.json", "bml.p4info.txtpb", "p4src.sha256"):
        assert (tmp_path / f"lanes{DEFAULT_LANES}" / name).read_bytes() == \
            (build_dir(DEFAULT_LANES) / name).read_bytes(), name
