#!/usr/bin/env bash
# The aarch64 wheel, run on this x86-64 machine under qemu-aarch64 (user mode), as a
# user of an Arm host (GH200, GB200, DGX Spark) installs it: an arm64 Debian 12 tree and
# its python 3.11, torch's manylinux_2_28_aarch64 wheel and its dependencies, the
# core-ops wheel, no compiler. Called by tools/compat.sh --arch aarch64.
#
#   bash tools/compat.sh --arch aarch64 --wheel dist/core_ops-*_aarch64.whl 2.14
#   bash tools/compat.sh --arch aarch64 --wheel W --paths "tests/optimizers" 2.14   # a part
#
# It checks, in order, and ends with one table (also $DIR/table.md):
#   1. `python -m core_ops info`: the CPU library is the wheel's, every CPU op native;
#   2. the CUDA library loads and registers its ops (no GPU: its kernels do not run);
#   3. the CPU kernel tests pass from the wheel (--paths: those instead), with every
#      compiler hidden and the kernel cache left empty.
# DIR (--dir, default ~/.cache/core-ops-compat/aarch64) keeps the logs; the tree, qemu
# and the aarch64 packages are made once, in $CROSS_DIR (tools/cross_aarch64.sh).
# Run time: docs/kernels.md, "The aarch64 wheel".
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/cross_aarch64.sh"
DIR=${XDG_CACHE_HOME:-$HOME/.cache}/core-ops-compat/aarch64
wheel="" release="" subset=()
# The kernel tests of tools/wheel_check.sh, SyncBatchNorm's CPU functions and amp's.
paths=(tests/multi_tensor_apply tests/optimizers tests/normalization tests/test_op_boundary.py
       tests/parallel/test_sync_batch_norm_ops.py tests/parallel/test_sync_batchnorm_local.py
       tests/amp/test_loss_scaler.py tests/amp/test_overflow.py tests/amp/test_master_remainders.py)
while [ $# -gt 0 ]; do
  case $1 in
    --wheel) wheel=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --paths) read -r -a paths <<<"$2"; shift 2 ;;
    -k) subset=(-k "$2"); shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --arch) shift 2 ;;  # compat.sh's, passed on
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "compat_aarch64.sh: unknown option $1" >&2; exit 2 ;;
    *) release=$1; shift ;;
  esac
done
[ -f "$wheel" ] && [ -n "$release" ] || { echo "usage: tools/compat.sh --arch aarch64 --wheel WHEEL RELEASE" >&2; exit 2; }
spec="torch==$release"
[[ $release =~ ^[0-9]+\.[0-9]+$ ]] && spec="torch==$release.*"
mkdir -p "$DIR/logs" && log="$DIR/logs"
t0=$SECONDS
cross_tree || exit 1
# The site folder is per torch release; the core-ops wheel goes in afresh each run.
cross_site "$CROSS_DIR/site-$release" "$spec" numpy pytest expecttest || exit 1
setup_s=$((SECONDS - t0))
rm -rf "$DIR/core" && PYTHON=${PYTHON:-python3} _cross_pip install --no-deps --target "$DIR/core" "$wheel" \
  >"$log/install.log" 2>&1 || { echo "compat_aarch64: the wheel did not install ($log/install.log)" >&2; exit 1; }
export PYTHONPATH="$DIR/core"
# The tests run from a copy holding no core_ops; an empty cache, and no compiler (the
# tree has none, and qemu runs no x86 program).
rm -rf "$DIR/src" "$DIR/cache" && mkdir -p "$DIR/src" "$DIR/cache"
cp -r "$repo/tests" "$repo/pyproject.toml" "$DIR/src/"
run() { (cd "$DIR/src" && CORE_OPS_CACHE_DIR="$DIR/cache" CXX=/nonexistent/c++ cross_python "$@"); }

version=$(run -c "import torch, platform; print(torch.__version__, platform.machine())" 2>"$log/torch.log") \
  || { echo "compat_aarch64: torch does not import under qemu ($log/torch.log)" >&2; exit 1; }
t1=$SECONDS
run -m core_ops info >"$log/info.log" 2>&1
cpu=$(grep -m1 "^\[cpu\]" "$log/info.log" | cut -c1-200)
not_native=$(awk -f "$repo/tools/cpu_ops_not_native.awk" "$log/info.log")
if [[ $cpu == "[cpu] native: the wheel's"* ]] && [ -z "$not_native" ]; then
  cpu="the wheel's, every op native, level ${cpu##*; level }"
else
  cpu="**not the wheel's or not all native**: ${cpu#\[cpu\] } ${not_native}"
fi
cuda=$(run - <<'EOF' 2>"$log/cuda.log"
import torch
from core_ops.native import loader
backend = loader.ensure("cuda", warn=False)
names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("core_ops::")]
on_cuda = [n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA")]
on_cpu = [n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "CPU")]
print(f"{'loaded' if backend.native else '**not loaded**'}, {len(on_cuda)} ops registered for CUDA "
      f"({len(on_cpu)} for CPU): {backend.reason[:90]}")
EOF
)
[ -n "$cuda" ] || cuda="**failed**: $(tail -n 1 "$log/cuda.log" | cut -c1-160)"
info_s=$((SECONDS - t1))
t2=$SECONDS
(cd "$DIR/src" && CORE_OPS_CACHE_DIR="$DIR/cache" CXX=/nonexistent/c++ cross_python -m pytest -q -p no:cacheprovider \
  -rfE "${subset[@]}" "${paths[@]}" >"$log/suite.log" 2>&1)
suite_s=$((SECONDS - t2))
summary=$(grep -E "(passed|failed|error).* in [0-9.]+s" "$log/suite.log" | tail -n 1 | tr -d '=' | sed -E 's/^ +| +$//g')
[ -n "$summary" ] || summary="no summary: $(tail -n 1 "$log/suite.log" | cut -c1-120)"
failures=$(grep -E "^(FAILED|ERROR) " "$log/suite.log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//' | awk 'NR <= 20' | paste -sd ' ' -)
[ -z "$(ls -A "$DIR/cache")" ] || failures="the cache was written: $(ls -A "$DIR/cache" | head -3 | paste -sd ' ' -) ${failures}"
{
  echo "| torch (qemu-aarch64) | wheel | native CPU kernels | CUDA library (no GPU) | kernel tests | failed | time |"
  echo "|---|---|---|---|---|---|---|"
  echo "| $version | $(basename "$wheel") | $cpu | $cuda | $summary | ${failures:--} | setup ${setup_s} s, info + CUDA ${info_s} s, tests ${suite_s} s |"
} | tee "$DIR/table.md"
