#!/usr/bin/env bash
# The aarch64 wheel, run on this x86-64 machine under qemu-aarch64 (user mode), as a
# user of an Arm host (GH200, GB200, DGX Spark) installs it: an arm64 Debian 12 tree and
# its python 3.11, torch's manylinux_2_28_aarch64 wheel and its dependencies, the
# core-ops wheel, no compiler. Called by tools/compat.sh --arch aarch64.
#
#   bash tools/compat.sh --arch aarch64 --wheel dist/core_ops-*_aarch64.whl 2.14
#   bash tools/compat.sh --arch aarch64 --wheel W --paths "tests/optimizers" 2.14   # a part
#   bash tools/compat.sh --arch aarch64 --wheel W --jit-only 2.14                   # step 4 alone
#
# It checks, in order, and ends with one table (also $DIR/table.md):
#   1. `python -m core_ops info`: the CPU library is the wheel's, every CPU op native;
#   2. the CUDA library loads and registers its ops (no GPU: its kernels do not run);
#   3. the CPU kernel tests pass from the wheel (--paths: those instead), with every
#      compiler hidden and the kernel cache left empty;
#   4. the JIT route: the sources (no core_ops/lib) build their CPU library with the
#      tree's g++ and pass the same tests. That runs in a chroot of the tree, its aarch64
#      programs started through binfmt_misc (qemu-user-static, registered here when it
#      is not: needs root); where that cannot be, the row says so.
# DIR (--dir, default ~/.cache/core-ops-compat/aarch64) keeps the logs; the tree, qemu
# and the aarch64 packages are made once, in $CROSS_DIR (tools/cross_aarch64.sh).
# Run time: docs/kernels.md, "The aarch64 wheel".
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/cross_aarch64.sh"
source "$repo/tools/without_compilers.sh"
DIR=${XDG_CACHE_HOME:-$HOME/.cache}/core-ops-compat/aarch64
wheel="" release="" subset=() jit_only=0
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
    --jit-only) jit_only=1; shift ;;
    --arch) shift 2 ;;  # compat.sh's, passed on
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
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
# Inside the tree, where the chroot of step 4 sees it as /opt/site-<release>.
cross_site "$CROSS_ROOT/opt/site-$release" "$spec" numpy pytest expecttest ninja || exit 1
setup_s=$((SECONDS - t0))
rm -rf "$DIR/core" && PYTHON=${PYTHON:-python3} _cross_pip install --no-deps --target "$DIR/core" "$wheel" \
  >"$log/install.log" 2>&1 || { echo "compat_aarch64: the wheel did not install ($log/install.log)" >&2; exit 1; }
export PYTHONPATH="$DIR/core"
# The tests run from a copy holding no core_ops; an empty cache, and no compiler: the
# host's hidden from PATH (qemu's root falls back to the host's files), the tree's g++
# out of the way (it is step 4's).
rm -rf "$DIR/src" "$DIR/cache" && mkdir -p "$DIR/src" "$DIR/cache"
cp -r "$repo/tests" "$repo/pyproject.toml" "$DIR/src/"
nocc=$(without_compilers "$DIR/nocc")
run() {
  (cd "$DIR/src" && unset CUDA_HOME && export PATH="$nocc" CORE_OPS_CACHE_DIR="$DIR/cache" CXX=/nonexistent/c++ \
    && cross_python "$@")
}

version=$(run -c "import torch, platform; print(torch.__version__, platform.machine())" 2>"$log/torch.log") \
  || { echo "compat_aarch64: torch does not import under qemu ($log/torch.log)" >&2; exit 1; }
wheel_rows() {  # steps 1 to 3
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
loader.ensure("cpu", warn=False)
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
run -m pytest -q -p no:cacheprovider -rfE "${subset[@]}" "${paths[@]}" >"$log/suite.log" 2>&1
suite_s=$((SECONDS - t2))
summary=$(grep -E "(passed|failed|error).* in [0-9.]+s" "$log/suite.log" | tail -n 1 | tr -d '=' | sed -E 's/^ +| +$//g')
[ -n "$summary" ] || summary="no summary: $(tail -n 1 "$log/suite.log" | cut -c1-120)"
failures=$(grep -E "^(FAILED|ERROR) " "$log/suite.log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//' | awk 'NR <= 20' | paste -sd ' ' -)
[ -z "$(ls -A "$DIR/cache")" ] || failures="the cache was written: $(ls -A "$DIR/cache" | head -3 | paste -sd ' ' -) ${failures}"
echo "| torch (qemu-aarch64) | wheel | native CPU kernels | CUDA library (no GPU) | kernel tests | failed | time |"
echo "|---|---|---|---|---|---|---|"
echo "| $version | $(basename "$wheel") | $cpu | $cuda | $summary | ${failures:--} | setup ${setup_s} s, info + CUDA ${info_s} s, tests ${suite_s} s |"
echo
}
jit_row() {  # step 4
  local t3=$SECONDS built jit_summary jit_failures opt="/opt/core-ops-jit"
  binfmt_aarch64 || { echo "| JIT route | not run: $BINFMT_WHY | - | - | - |"; return; }
  rm -rf "$CROSS_ROOT$opt" && mkdir -p "$CROSS_ROOT$opt/cache"
  (cd "$repo" && git ls-files -co --exclude-standard -z -- core_ops core_ops_autoload.py tests pyproject.toml \
    | xargs -0 cp --parents -t "$CROSS_ROOT$opt")
  rm -rf "$CROSS_ROOT$opt/core_ops/lib"
  # QEMU_CPU: a Neoverse N1, no SVE. Where the CPU has SVE, the tests that compile with
  # inductor include torch's SVE vector headers, and Debian 12's GCC 12 crashes on them
  # (an internal compiler error in vec/sve/vec_float.h, torch's code, not core-ops').
  in_tree() {
    QEMU_CPU=neoverse-n1 chroot "$CROSS_ROOT" /usr/bin/env -i HOME=/root QEMU_CPU=neoverse-n1 \
      PATH="/usr/bin:/bin:/opt/site-$release/bin" \
      PYTHONPATH="$opt:/opt/site-$release" CORE_OPS_CACHE_DIR="$opt/cache" CXX=g++ \
      /bin/sh -c "cd $opt && /usr/bin/python3.11 $*"
  }
  in_tree -m core_ops build >"$log/jit-build.log" 2>&1
  built=$(grep -m1 "^cpu:" "$log/jit-build.log" | cut -c1-160)
  in_tree -m pytest -q -p no:cacheprovider -rfE "${subset[*]}" "${paths[*]}" >"$log/jit-suite.log" 2>&1
  jit_summary=$(grep -E "(passed|failed|error).* in [0-9.]+s" "$log/jit-suite.log" | tail -n 1 | tr -d '=' | sed -E 's/^ +| +$//g')
  jit_failures=$(grep -E "^(FAILED|ERROR) " "$log/jit-suite.log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//' | awk 'NR <= 20' | paste -sd ' ' -)
  echo "| JIT route (chroot, binfmt) | ${built:-no build line: $(tail -n 1 "$log/jit-build.log" | cut -c1-120)} | ${jit_summary:-no summary} | ${jit_failures:--} | $((SECONDS - t3)) s |"
}

# binfmt_misc runs the tree's aarch64 programs (python, g++, ninja) through qemu, so a
# chroot of the tree is an aarch64 machine; qemu-user-static's entry, registered here.
binfmt_aarch64() {
  local misc=/proc/sys/fs/binfmt_misc
  [ -e "$misc/qemu-aarch64" ] && return 0
  BINFMT_WHY="no binfmt_misc entry for aarch64, and it cannot be made here (needs root)"
  [ "$(id -u)" = 0 ] || return 1
  [ -e "$misc/register" ] || mount -t binfmt_misc binfmt_misc "$misc" 2>/dev/null || return 1
  [ -x /usr/bin/qemu-aarch64-static ] || _cross_apt qemu-user-static || return 1
  cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$misc/register" 2>/dev/null || true
  [ -e "$misc/qemu-aarch64" ]
}

rows=""
[ "$jit_only" = 1 ] || rows=$(wheel_rows)
jit=$(jit_row)
{
  [ -z "$rows" ] || echo "$rows"
  echo
  echo "| route | build | kernel tests | failed | time |"
  echo "|---|---|---|---|---|"
  echo "$jit"
} | tee "$DIR/table.md"
