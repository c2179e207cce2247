#!/usr/bin/env bash
# Compile p4src/ with p4c's BMv2 back end into p4src/build/ and record the sources' hash.
# Uses a local p4c-bm2-ss ($P4C, PATH, /opt/p4c/bin) or, failing that, the p4lang/p4c image.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${BML_BUILD_OUT:-p4src/build}  # tests/test_build.py compiles elsewhere and compares
mkdir -p "$out"
args=(--arch v1model --std p4-16 -I p4src -o "$out/bml.json"
      --p4runtime-files "$out/bml.p4info.txtpb" p4src/bml.p4)
p4c=${P4C:-$(command -v p4c-bm2-ss || true)}
if [ -z "$p4c" ] && [ -x /opt/p4c/bin/p4c-bm2-ss ]; then p4c=/opt/p4c/bin/p4c-bm2-ss; fi
if [ -n "$p4c" ]; then
  echo "build: $p4c ($("$p4c" --version | tail -1))"
  "$p4c" "${args[@]}"
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "build: p4lang/p4c docker image"
  docker run --rm -v "$PWD:/src" -w /src p4lang/p4c:latest p4c-bm2-ss "${args[@]}"
else
  echo "build: no p4c-bm2-ss and no docker engine: cannot compile p4src" >&2
  exit 1
fi
# The sources' hash (control_plane/p4info.py: p4_source_hash computes the same in Python).
hash=$(cd p4src && find . -name '*.p4' -not -path './build/*' | sed 's|^\./||' | LC_ALL=C sort \
       | xargs sha256sum | sha256sum | cut -d' ' -f1)
echo "$hash  p4src/**/*.p4 (sha256 of their sha256sum listing)" > "$out/p4src.sha256"
echo "build: $out/bml.json, $out/bml.p4info.txtpb, sources $hash"
