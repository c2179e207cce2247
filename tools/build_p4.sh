#!/usr/bin/env bash
# Compile p4src/ with p4c's BMv2 back end, once per lane width, into p4src/build/lanes<N>/
# (bml.json, bml.p4info.txtpb, p4src.sha256: the sources' hash), with -DLANE_BLOCKS=<N/32>.
#   tools/build_p4.sh            every width (BML_LANES, else all of BUILT_LANES below)
#   tools/build_p4.sh 64 256     those widths only
# Uses a local p4c-bm2-ss ($P4C, PATH, /opt/p4c/bin) or, failing that, the p4lang/p4c image.
# The 2208-lane build takes minutes and about 2 GB of memory; 64 lanes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILT_LANES="64 256 2208"  # bml.protocol.BUILT_LANES (tests/test_build.py holds them equal)
out=${BML_BUILD_OUT:-p4src/build}  # tests/test_build.py compiles elsewhere and compares
if [ $# -gt 0 ]; then widths="$*"; else widths=${BML_LANES:-$BUILT_LANES}; fi
for lanes in $widths; do
  case " $BUILT_LANES " in
    *" $lanes "*) ;;
    *) echo "build: no $lanes-lane build (the widths are $BUILT_LANES)" >&2; exit 1 ;;
  esac
done

p4c=${P4C:-$(command -v p4c-bm2-ss || true)}
if [ -z "$p4c" ] && [ -x /opt/p4c/bin/p4c-bm2-ss ]; then p4c=/opt/p4c/bin/p4c-bm2-ss; fi
if [ -n "$p4c" ]; then
  echo "build: $p4c ($("$p4c" --version 2>&1 | tail -1))"
  compile() { "$p4c" "$@"; }
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo "build: p4lang/p4c docker image"
  compile() { docker run --rm -v "$PWD:/src" -w /src p4lang/p4c:latest p4c-bm2-ss "$@"; }
else
  echo "build: no p4c-bm2-ss and no docker engine: cannot compile p4src" >&2
  exit 1
fi

# The sources' hash (control_plane/p4info.py: p4_source_hash computes the same in Python).
hash=$(cd p4src && find . -name '*.p4' -not -path './build/*' | sed 's|^\./||' | LC_ALL=C sort \
       | xargs sha256sum | sha256sum | cut -d' ' -f1)
for lanes in $widths; do
  dir="$out/lanes$lanes"
  mkdir -p "$dir"
  start=$SECONDS
  compile --arch v1model --std p4-16 -I p4src -DLANE_BLOCKS=$((lanes / 32)) \
    -o "$dir/bml.json" --p4runtime-files "$dir/bml.p4info.txtpb" p4src/bml.p4
  echo "$hash  p4src/**/*.p4 (sha256 of their sha256sum listing)" > "$dir/p4src.sha256"
  echo "build: $lanes lanes in $((SECONDS - start)) s: $dir/bml.json, $dir/bml.p4info.txtpb," \
       "sources $hash"
done
