#!/usr/bin/env bash
# Set up a fresh machine for BML-INA: system tools (as root, via apt-get) and a virtualenv.
# Idempotent: a second run only checks. Used by `make setup`, `make run`, `make test`, .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
command -v sysctl >/dev/null 2>&1 || need+=(procps)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v nft >/dev/null 2>&1 || need+=(nftables)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to apt-get install ${need[*]}" >&2; exit 1
  fi
  echo "setup: apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Another apt-get at the same moment (an unattended upgrade, a toolchain build) holds the
  # dpkg lock: wait for it rather than fail.
  wait_lock=(-o DPkg::Lock::Timeout=600)
  apt-get "${wait_lock[@]}" update -qq
  apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.bml-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch (CPU) + mlxtend: the DDP hook, its tests and bml-train (tests/test_torch_hook.py)
  .venv/bin/python -m pip install -q -e ".[test,bench,torch]"
  touch "$stamp"
fi
