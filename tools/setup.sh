#!/usr/bin/env bash
# Sets up a development environment in .venv: torch, core_ops and both plugins
# (editable), test tools. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
# CI and the README use torch 2.14.1; pyproject admits 2.10 to 2.15 (tools/compat.sh
# runs the suite on the others).
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==2.14.1"
# [cuda]: NVIDIA's pip-packaged CUDA compiler, so that the test of a build without a
# system toolkit runs (tests/test_build.py); about 100 MB.
# Installed once per version of the packaging files: a second run (tools/demo.sh
# calls this script every time) finds the stamp and skips pip.
stamp=.venv/.core-ops-installed
want=$(cat pyproject.toml plugins/*/pyproject.toml plugins/*/setup.py | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  pip install -e ".[test,cuda]" -e "plugins/lightning[demo]" -e plugins/accelerate
fi
# The plugins' wheels carry a .pth that loads them when Lightning / Accelerate is
# imported (Note [Plugin autoload] in core_ops_autoload.py); editable installs cannot,
# so the development environment gets the same files here (before anything imports
# core_ops, which warns about a plugin installed without them).
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp plugins/lightning/core-ops-lightning-autoload.pth plugins/accelerate/core-ops-accelerate-autoload.pth "$site/"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -c "import core_ops, core_ops_lightning, core_ops_accelerate" \
    || { echo "setup failed: packages do not import" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
# aarch64's CPU level is tested from this machine (tests/test_cpu_vec.py, neon): the
# cross compiler and qemu-user, from Debian's archive where apt-get runs as root; the
# tests skip, saying so, where they cannot be had.
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    # Bounded: a slow mirror costs the neon tests, never the run.
    { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq \
        crossbuild-essential-arm64 qemu-user; } \
      >/dev/null 2>&1 || echo "setup: crossbuild-essential-arm64 / qemu-user did not install: the neon tests will skip" >&2
  fi
fi
