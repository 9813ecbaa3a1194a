#!/usr/bin/env bash
# Runs Python with core-ops' CPU kernels built and loaded under AddressSanitizer and
# UndefinedBehaviorSanitizer (CORE_OPS_SANITIZE=1, core_ops/settings.py): the sanitized
# library is built into its own cache entry, and the sanitizers' runtimes are preloaded,
# as an uninstrumented Python needs. A memory error or an undefined operation in a
# kernel aborts the run with its report.
#
#   bash tools/sanitize.sh                       # the fuzz slice and the kernel tests
#   bash tools/sanitize.sh tests/fuzz/run.py --seeds 0 1 2 --seconds 600
#   bash tools/sanitize.sh -m pytest -q tests/normalization
#   bash tools/sanitize.sh --cuda                # on a GPU: compute-sanitizer memcheck + racecheck
#
# docs/faults.md, "Checked by machine", says what each run covers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}

# --cuda [pytest args]: on a GPU machine, the CUDA kernel tests under compute-sanitizer's
# memcheck, then racecheck (tests/gpu/run.sh runs it; the CPU part needs a compiler's
# sanitizer runtimes, which a bare GPU image may lack).
if [ "${1:-}" = "--cuda" ]; then
  shift
  cs=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/compute-sanitizer \
       /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1 || true)
  [ -n "$cs" ] || { echo "sanitize.sh: no compute-sanitizer on PATH or in CUDA_HOME"; exit 2; }
  [ $# -gt 0 ] || set -- tests/multi_tensor_apply/test_cpu_cuda_parity.py tests/normalization/test_norm_ops.py \
    tests/optimizers/test_fused_adam.py tests/parallel/test_sync_batch_norm_ops.py -k cuda -x
  for tool in memcheck racecheck; do
    echo "---- compute-sanitizer --tool $tool ----"
    "$cs" --tool "$tool" --error-exitcode 3 --target-processes all "$PY" -m pytest -q -p no:cacheprovider "$@"
  done
  exit 0
fi
CXX_=${CXX:-c++}
asan=$("$CXX_" -print-file-name=libasan.so)
ubsan=$("$CXX_" -print-file-name=libubsan.so)
for lib in "$asan" "$ubsan"; do
  [ -f "$lib" ] || { echo "sanitize.sh: $CXX_ has no $(basename "$lib") (install its sanitizer runtimes)" >&2; exit 2; }
done
export CORE_OPS_SANITIZE=1
export LD_PRELOAD="$asan $ubsan${LD_PRELOAD:+ $LD_PRELOAD}"
# Python and torch keep memory until exit on purpose: leaks are not what is looked for.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$PY" -m core_ops build >/dev/null
if [ $# -eq 0 ]; then
  set -- -m pytest -q -p no:cacheprovider tests/test_op_boundary.py tests/fuzz tests/multi_tensor_apply \
    tests/normalization/test_norm_ops.py tests/optimizers/test_fused_adam.py tests/optimizers/test_fused_adam_compact.py \
    tests/parallel/test_sync_batch_norm_ops.py
fi
exec "$PY" "$@"
