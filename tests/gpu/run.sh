#!/usr/bin/env bash
# Builds and runs every GPU test and GPU benchmark on a bare GPU machine whose python3
# holds a CUDA build of torch, Lightning, Accelerate, pytest-xdist and pytest-timeout
# (nothing is installed: the repo and its plugins are put on PYTHONPATH; the kernels come
# from a wheel in dist/ when there is one, else they build on first use).
#   bash tests/gpu/run.sh            # from anywhere
# To run the wheel's kernels there: `bash tools/wheel.sh dist` here first (5 min 35 s on
# 2 cores, 19.3 MiB), and dist/ travels with the repo (the device tool's carry).
# It ends with one table: step, verdict, seconds, and the failed tests by name; the
# logs stay in $OUT/gpu_run (default /tmp). Exits 1 if any step failed.
# Then bench/gpu_targets.py measures every speed target of the GPU issue and prints
# them as a second table: target, measured value, pass/fail; bench_syncbn.py times
# SyncBatchNorm against torch's on every GPU.
# Budget: the step limits add up to 600 s, build included, so a slow step is cut and
# reported, never the whole run. The tests run on 8 xdist workers with a per-test
# timeout: a test that crashes its worker is reported by name as failed and the
# worker is replaced, so one crash hides no other result.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD:$PWD/plugins/lightning:$PWD/plugins/accelerate${PYTHONPATH:+:$PYTHONPATH}"
# A cache of this run's own, made 0700 (Note [A cache no one else writes]): never a
# predictable folder in /tmp that another user could have made first.
export CORE_OPS_CACHE_DIR=${CORE_OPS_CACHE_DIR:-$(mktemp -d -t core_ops_gpu_cache.XXXXXX)}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
LOG=${OUT:-/tmp}/gpu_run
mkdir -p "$LOG"
rows=()
failed=0

# step NAME LIMIT_S CMD...: run it with its log kept, and add its row to the table.
step() {
  local name=$1 limit=$2; shift 2
  local t0 rc verdict failures
  t0=$(date +%s)
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  case $rc in
    0) verdict=ok ;;
    124) verdict="cut at ${limit} s" ;;
    *) verdict="failed (rc $rc)" ;;
  esac
  [ "$rc" -ne 0 ] && failed=1
  # pytest's short summary (-rfE) names each failure; a crashed worker's test is among them.
  failures=$(grep -E "^(FAILED|ERROR) " "$LOG/$name.log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//' \
             | awk 'NR <= 40' | paste -sd ' ' -)
  [ -z "$failures" ] && [ "$rc" -ne 0 ] && failures="$(tail -n 1 "$LOG/$name.log" | cut -c1-160)"
  rows+=("| $name | $verdict | $(( $(date +%s) - t0 )) | $(tail -n 1 "$LOG/$name.log" | tr "|" "/" | cut -c1-90) | ${failures:--} |")
}

gpu=$($PY -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.__version__, torch.cuda.get_device_name(0))") \
  || { echo "no usable GPU: nothing to run"; exit 1; }
# Build for this GPU only: an image's TORCH_CUDA_ARCH_LIST may name many archs (a
# longer build) or ones CUDA 13 dropped (a failed one).
export CORE_OPS_CUDA_ARCH=${CORE_OPS_CUDA_ARCH:-$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))")}

# The wheel, where one was made for this run (`bash tools/wheel.sh dist` at this commit,
# carried as dist/): its libraries go where an installed core_ops keeps them, so the
# kernels are the wheel's and the build step below takes them and builds nothing
# (Note [Prebuilt libraries]). Without a wheel, or where this torch cannot take its
# CUDA library (CUDA 12), that step builds for this GPU as before.
wheel=$(ls dist/core_ops-*.whl 2>/dev/null | tail -n 1)
if [ -n "$wheel" ]; then
  step wheel 30 $PY -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
z.extractall('.', [n for n in z.namelist() if n.startswith('core_ops/lib/')]); print('libraries of', sys.argv[1])" "$wheel"
fi
step build 140 $PY -m core_ops build --cuda
step info 10 $PY -m core_ops info
# The whole GPU selection: the core's CUDA tests, core_ops DDP, SyncBatchNorm and the opt levels on FSDP2 over
# NCCL at world size 1, and the plugins' one-GPU Trainer, Fabric and Accelerate runs.
# Not the two-arch build test: the build step above built this GPU's arch already.
step tests 150 $PY -m pytest -q -p no:cacheprovider -n 8 --timeout 120 -rfE \
  -k "(cuda or gpu) and not compiles_for_sm80_and_sm90 and not cpu_offload_fused_adam_step" \
  tests plugins/lightning/tests plugins/accelerate/tests
# FSDP2's CPUOffloadPolicy: FusedAdam's step on the CPU shards against torch's
# AdamW(foreach), a timing, so alone (no xdist neighbours); -s keeps its figures in the log.
step offload 60 $PY -m pytest -q -s -p no:cacheprovider -rfE tests/parallel/test_fsdp_cuda.py \
  -k cpu_offload_fused_adam_step
step bench 30 $PY bench/bench_multi_tensor.py --device cuda --numel 200000000 --tensors 200 --repeats 10
step syncbn 30 $PY bench/bench_syncbn.py --device cuda --repeats 20
step targets 90 $PY bench/gpu_targets.py --device cuda
# The CUDA kernel tests under compute-sanitizer (memcheck, then racecheck), where the
# image has it; cut at 90 s, so the table still comes (docs/faults.md, "Checked by machine").
PYTHON=$PY step sanitizer 90 bash tools/sanitize.sh --cuda

echo "---- bench_multi_tensor ----"; grep -E "^\|" "$LOG/bench.log" | tail -n 30
echo "---- bench_syncbn ----"; grep -E "^\|" "$LOG/syncbn.log"
echo "---- FusedAdam on FSDP2's CPU-offloaded shards ----"; grep -E "^FSDP2 CPUOffloadPolicy" "$LOG/offload.log"
echo "---- the GPU issue's targets (bench/gpu_targets.py) ----"; grep -E "^\||^copy|^targets" "$LOG/targets.log"
echo
echo "core_ops GPU run: $gpu, arch $CORE_OPS_CUDA_ARCH, logs in $LOG"
echo "| step | verdict | s | last line | failed tests |"
echo "|---|---|---:|---|---|"
printf '%s\n' "${rows[@]}"
exit $failed
