#!/usr/bin/env bash
# Compile p4src/ with p4c's BMv2 back end into p4src/build/ and record the sources' hash.
# Uses a local p4c-bm2-ss ($P4C, PATH, /opt/p4c/bin) or, failing that, the p4lang/p4c image.
set -euo pipefail
cd "$(dirname "$0")/.."
out=p4src/build
mkdir -p "$out"
args=(--arch v1model --std p4-16 -I p4src -o "$out/bml.json"
      --p4runtime-files "$out/bml.p4info.txtpb" p4src/bml.p4)
p4c=${P4C:-$(command -v p4c-bm2-ss || true)}
[ -n "$p4c" ] || { [ -x /opt/p4c/bin/p4c-bm2-ss ] && p4c=/opt/p4c/bin/p4c-bm2-ss; } || true
if [ -n "$p4c" ]; then
  echo "build: $p4c ($("$p4c" --version | head -1))"
  "$p4c" "${args[@]}"
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "build: p4lang/p4c docker image"
  docker run --rm -v "$PWD:/src" -w /src p4lang/p4c:latest p4c-bm2-ss "${args[@]}"
else
  echo "build: no p4c-bm2-ss and no docker engine: cannot compile p4src" >&2
  exit 1
fi
.venv/bin/python -c "from control_plane.p4info import p4_source_hash as h; print(h(), 'p4src/*.p4')" \
  > "$out/p4src.sha256"
echo "build: $out/bml.json, $out/bml.p4info.txtpb, hash $(cut -c1-12 "$out/p4src.sha256")"
