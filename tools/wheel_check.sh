#!/usr/bin/env bash
# Installs a wheel made by tools/wheel.sh into a fresh venv, with every C/C++ compiler
# hidden and an empty kernel cache, and runs the suite's CPU kernel tests on it: every
# op must run natively from the wheel's library, and nothing may be written to the cache.
#
#   bash tools/wheel_check.sh --build            # tools/wheel.sh first (what CI runs): CPU + CUDA sm_90,
#                                                # or --cpu-only where no CUDA toolkit is found
#   bash tools/wheel_check.sh WHEEL [--torch SPEC] [-k EXPR]
#
# SPEC is the torch to install beside it (default torch==2.14.1); the venv and logs
# stay in $DIR (default: a new temporary folder, whose ~5.5 GB venv is removed once the
# check passes: repeated runs filled this machine's disk).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/without_compilers.sh"
PYTHON=${PYTHON:-python3}
own_dir=0
[ -n "${DIR:-}" ] || { DIR=$(mktemp -d -t core_ops_wheel_check.XXXXXX); own_dir=1; }
wheel="" torch_spec="torch==2.14.1" subset=() build=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=1; shift ;;
    --torch) torch_spec=$2; shift 2 ;;
    -k) subset=(-k "$2"); shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) wheel=$1; shift ;;
  esac
done
fail() { echo "wheel_check: FAILED: $*" >&2; exit 1; }
if [ "$build" = 1 ]; then
  # Both libraries where a CUDA toolkit is at hand (the CUDA one for sm_90 only: its
  # imports are the same for every arch), else the CPU one.
  scope=(--cpu-only)
  PY=${PYTHON_BUILD:-$repo/.venv/bin/python}
  "$PY" -c "import sys; from core_ops.native import toolchain; sys.exit(toolchain.missing('cuda') is not None)" \
    2>/dev/null && scope=(--cuda-archs 9.0)
  bash "$repo/tools/wheel.sh" "$DIR/dist" "${scope[@]}" || fail "tools/wheel.sh ${scope[*]}"
  wheel=$(ls "$DIR"/dist/core_ops-*.whl)
  # Note [glibc 2.28] (csrc/include/core_ops/glibc_floor.h): the libraries install
  # wherever torch's own wheels do; a newer import raises auditwheel's policy.
  glibc=$(basename "$wheel" | grep -o -m1 'manylinux_2_[0-9]*' | cut -d_ -f3)
  [ -n "$glibc" ] && [ "$glibc" -le 28 ] \
    || fail "$(basename "$wheel") (${scope[*]}): a library needs a newer glibc or libstdc++ than manylinux_2_28"
  echo "wheel_check: built with ${scope[*]}: $(basename "$wheel")"
fi
[ -f "$wheel" ] || fail "no wheel given (see --help)"
"$PYTHON" -m venv "$DIR/venv" || fail "venv"
py="$DIR/venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check "$torch_spec" >"$DIR/torch.log" 2>&1 || fail "$torch_spec did not install ($DIR/torch.log)"
"$py" -m pip install -q --disable-pip-version-check "$wheel" pytest expecttest >"$DIR/install.log" 2>&1 || fail "the wheel did not install ($DIR/install.log)"

# The tests run from a copy holding no core_ops, so every import is the installed wheel's.
mkdir -p "$DIR/src" && cp -r "$repo/tests" "$repo/pyproject.toml" "$DIR/src/"
cache="$DIR/empty-cache"; mkdir -p "$cache"
run() {
  (cd "$DIR/src" && env -u CUDA_HOME PATH="$(without_compilers "$DIR/nocc")" CXX=/nonexistent/c++ \
    CORE_OPS_CACHE_DIR="$cache" "$py" "$@")
}
run -c "import shutil, sys; sys.exit(shutil.which('c++') or shutil.which('gcc') or shutil.which('g++'))" \
  || fail "a compiler is still on PATH"
run -m core_ops info >"$DIR/info.log" 2>&1 || fail "core_ops info ($DIR/info.log)"
grep -q "^\[cpu\] native: the wheel's" "$DIR/info.log" || fail "the CPU library is not the wheel's: $(grep -m1 '^\[cpu\]' "$DIR/info.log")"
not_native=$(awk -f "$repo/tools/cpu_ops_not_native.awk" "$DIR/info.log")
[ -z "$not_native" ] || fail "ops not native on the CPU: $not_native"
start=$SECONDS
run -m pytest -q -p no:cacheprovider "${subset[@]}" tests/multi_tensor_apply tests/optimizers tests/normalization \
  tests/test_op_boundary.py tests/fuzz \
  >"$DIR/suite.log" 2>&1
rc=$?
summary=$(grep -E "(passed|failed|error)" "$DIR/suite.log" | tail -n 1)
[ $rc = 0 ] || { tail -n 30 "$DIR/suite.log"; fail "the CPU kernel tests: $summary"; }
[ -z "$(ls -A "$cache")" ] || fail "the tests wrote to the kernel cache: $(ls -A "$cache" | head -3)"
# A figure, not a check: the time a user waits before the first step (issue target: 3 s).
cp -r "$repo/bench" "$DIR/src/" && run bench/bench_first_step.py --runs 3 | tail -n 1
echo "wheel_check: $(basename "$wheel") on $("$py" -c 'import torch; print(torch.__version__)'), no compiler," \
  "empty cache: $(grep -m1 '^\[cpu\]' "$DIR/info.log" | cut -c1-60)...; $summary ($((SECONDS - start)) s)"
[ "$own_dir" = 1 ] && rm -rf "$DIR/venv"
exit 0
