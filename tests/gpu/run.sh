#!/usr/bin/env bash
# Builds and runs every GPU test and GPU benchmark on a bare GPU machine whose python3
# holds a CUDA build of torch (nothing is installed: the repo is put on PYTHONPATH and
# the kernels build on first use). Prints one summary line per step, the benchmark
# tables and the failures; exits 1 if any step failed.
#   bash tests/gpu/run.sh            # from the repo root
# Budget: the step limits add up to 550 s, under the device tool's 600 s per command
# (machine start-up is not counted there), so a slow step is cut and reported, never
# the whole run.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CORE_OPS_CACHE_DIR=${CORE_OPS_CACHE_DIR:-/tmp/core_ops_gpu_cache}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
LOG=${OUT:-/tmp}/gpu_run
mkdir -p "$LOG"
summary=()
failed=0
step() {  # step NAME TIMEOUT_S CMD...: run, keep the log, remember the verdict
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  [ "$rc" -ne 0 ] && failed=1
  summary+=("$(printf '%-8s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$(tail -n 1 "$LOG/$name.log")")")
}

gpu=$($PY -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.__version__, torch.cuda.get_device_name(0))") \
  || { echo "no usable GPU: nothing to run"; exit 1; }
# Build for this GPU only: an image's TORCH_CUDA_ARCH_LIST may name many archs (a
# longer build) or ones CUDA 13 dropped (a failed one).
export CORE_OPS_CUDA_ARCH=${CORE_OPS_CUDA_ARCH:-$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))")}

step build 230 $PY -m core_ops build --cuda
step info 20 $PY -m core_ops info
step tests 150 $PY -m pytest -q -p no:cacheprovider tests/multi_tensor_apply tests/optimizers tests/amp tests/normalization tests/test_op_registration.py -k "cuda or gpu"
# core_ops.parallel: SyncBatchNorm's CUDA kernels vs torch.nn.SyncBatchNorm at world size 1.
step syncbn 50 $PY -m pytest -q -s -p no:cacheprovider tests/parallel/test_sync_batchnorm_cuda.py tests/parallel/test_sync_batch_norm_ops.py -k "cuda or gpu or world_size or faster"
step bench 60 $PY bench/bench_multi_tensor.py --device cuda --numel 200000000 --tensors 200
step norms 40 $PY bench/bench_norms.py --device cuda --repeats 20

echo "==== core_ops GPU run: $gpu, arch $CORE_OPS_CUDA_ARCH ===="
printf '%s\n' "${summary[@]}"
echo "---- bench ----"; tail -n 20 "$LOG/bench.log"
echo "---- norms ----"; tail -n 18 "$LOG/norms.log"
echo "---- syncbn ----"; grep -E "SyncBN|passed|failed" "$LOG/syncbn.log" | tail -3
echo "---- failures ----"; grep -hE "^(FAILED|ERROR)" "$LOG/tests.log" "$LOG/syncbn.log" | head -20
exit $failed
