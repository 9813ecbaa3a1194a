#!/usr/bin/env bash
# The compatibility run: for each torch release named, a fresh venv with that torch,
# this repository installed into it as a user installs it (non-editable: core-ops with
# [test] and, where torch's wheel pins a CUDA 13 toolkit, [cuda]; both plugins), the
# native kernels built, and the test suite run against the installed packages. Ends
# with one table, also written to $DIR/table.md.
#
#   bash tools/compat.sh 2.9 2.15             # the newest patch of each: torch==2.9.*
#   bash tools/compat.sh 2.13.0+cpu 2.14.1    # exact builds
#   bash tools/compat.sh -k fsdp 2.15         # a subset of the suite (pytest -k)
#   bash tools/compat.sh --past-pin 2.16      # a release outside pyproject's torch pin
#   bash tools/compat.sh --no-cuda 2.9        # skip the CUDA kernels' build (~4 min each)
#   bash tools/compat.sh --dir /tmp/compat 2.9
#   bash tools/compat.sh --wheel dist/core_ops-*.whl 2.10 2.15   # one wheel (tools/wheel.sh) in each
#   bash tools/compat.sh --paths "tests/optimizers tests/normalization" 2.15   # these tests only
#   bash tools/compat.sh --arch aarch64 --wheel dist/core_ops-*_aarch64.whl 2.14  # under qemu
#
# With --wheel, each venv gets that wheel instead of the sources, nothing is built, and
# the suite runs with every compiler hidden and an empty kernel cache (which must stay
# empty): the native CPU column then says whether the wheel's library served the ops.
# DIR is --dir's, else ~/.cache/core-ops-compat: torch-<release>/ holds the venv (made
# anew each run), the copy of the sources the suite runs from, the kernel cache and the
# logs of each step. A machine whose pip config caps torch (a constraint file) needs
# PIP_CONFIG_FILE=/dev/null for releases above the cap. Its use: docs/kernels.md,
# "Supported torch releases".
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/without_compilers.sh"
DIR=${XDG_CACHE_HOME:-$HOME/.cache}/core-ops-compat
PYTHON=${PYTHON:-python3}
subset=() paths=() past_pin=0 cuda=1 releases=() rows=() wheel=""

parse_args() {
  while [ $# -gt 0 ]; do
    case $1 in
      -k) subset=(-k "$2"); shift 2 ;;
      --paths) read -r -a paths <<<"$2"; shift 2 ;;
      --past-pin) past_pin=1; shift ;;
      --no-cuda) cuda=0; shift ;;
      --wheel) wheel=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); cuda=0; shift 2 ;;
      --dir) DIR=$2; shift 2 ;;
      -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
      -*) echo "compat.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
      *) releases+=("$1"); shift ;;
    esac
  done
  [ ${#releases[@]} -gt 0 ] || { echo "usage: tools/compat.sh [-k EXPR] [--paths 'PATH ...'] [--past-pin] [--no-cuda] [--wheel WHEEL] [--dir DIR] RELEASE..." >&2; exit 2; }
  mkdir -p "$DIR"
}

# The source installed: the repository's files (tracked and new, not ignored), copied so
# that --past-pin can drop the pin, a build leaves nothing in the work tree, and the
# suite runs the tests of the sources installed, whatever the work tree becomes meanwhile.
source_copy() {
  local to=$1
  rm -rf "$to" && mkdir -p "$to"
  (cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$to")
  if [ "$past_pin" = 1 ]; then
    sed -i -E 's/"torch[<>=!~][^"]*"/"torch"/' "$to/pyproject.toml"
  fi
}

# without_nvcc PATH: PATH less the folders that hold an nvcc.
without_nvcc() {
  local IFS=: dir kept=()
  for dir in $1; do [ -x "$dir/nvcc" ] || kept+=("$dir"); done
  echo "${kept[*]}"
}

# seconds CMD...: run it, print its wall seconds on fd 3.
seconds() { local t0=$SECONDS; "$@"; local rc=$?; echo $(( SECONDS - t0 )) >&3; return $rc; }

one_release() {
  local release=$1 home="$DIR/torch-$release" spec py version torch_s install_s extras
  spec="torch==$release"
  [[ $release =~ ^[0-9]+\.[0-9]+$ ]] && spec="torch==$release.*"
  rm -rf "$home" && mkdir -p "$home/logs"
  local log="$home/logs"
  "$PYTHON" -m venv "$home/venv" || { rows+=("| $release | venv failed | - | - | - | - |"); return; }
  py="$home/venv/bin/python"
  pip() { "$py" -m pip --disable-pip-version-check "$@"; }
  torch_s=$( { seconds pip install "$spec" >"$log/torch.log" 2>&1; } 3>&1 ) \
    || { rows+=("| $release | torch did not install: $(grep -m1 -E 'ERROR' "$log/torch.log" | cut -c1-120) | - | - | - | - |"); return; }
  version=$("$py" -c "import torch; print(torch.__version__)" 2>/dev/null)
  echo "== torch $version ($torch_s s to install)"
  # [cuda] where torch's wheel pins NVIDIA's cuda-toolkit: the extra then takes the
  # compiler of that same release (Note [CUDA toolkit from pip]).
  extras=test
  "$py" -c "from importlib.metadata import requires; import sys; sys.exit(not any(r.startswith('cuda-toolkit') for r in requires('torch') or []))" \
    && extras=test,cuda
  source_copy "$home/src"
  # pip must keep the torch installed (the distribution's version: 2.14.1, not 2.14.1+cu130).
  "$py" -c "from importlib.metadata import version; print('torch==' + version('torch'))" >"$home/constraints.txt"
  local core="$home/src[$extras]"
  [ -n "$wheel" ] && core="$wheel[test]"
  install_s=$( { seconds pip install -c "$home/constraints.txt" "$core" \
    "$home/src/plugins/lightning[demo]" "$home/src/plugins/accelerate" >"$log/install.log" 2>&1; } 3>&1 ) \
    || { rows+=("| $version | refused: $(grep -m1 -E 'ERROR|requested' "$log/install.log" | cut -c1-160) | - | - | - | - |"); return; }
  # The suite runs from that copy, its own packages (and the egg-info the install left,
  # which pkg_resources would take for a second core_ops) taken out, so that every import of
  # core_ops comes from the venv (also in the subprocesses and workers the tests start,
  # whose sys.path holds the copy's root). The plugins' sources stay: they are not on
  # sys.path, and a test builds their wheels.
  rm -rf "$home/src/core_ops" "$home/src/core_ops_autoload.py" "$home/src/build" "$home/src/"*.egg-info
  export CORE_OPS_CACHE_DIR="$home/kernels"
  local where
  where=$(cd "$home/src" && "$py" -c "import core_ops, core_ops_lightning, core_ops_accelerate as a; print(core_ops.__file__, a.__file__)")
  case $where in
    "$home/venv/"*" $home/venv/"*) ;;
    *) rows+=("| $version | installed, but imports resolve outside the venv: $where | - | - | - | - |"); return ;;
  esac
  local cpu_s cpu cuda_col="-" cuda_s suite_s summary failures run_env=(env)
  if [ -n "$wheel" ]; then
    mkdir -p "$home/kernels"
    run_env=(env -u CUDA_HOME PATH="$(without_compilers "$home/nocc")" CXX=/nonexistent/c++)
    (cd "$home/src" && "${run_env[@]}" "$py" -m core_ops info >"$log/info.log" 2>&1)  # the venv's core_ops
    cpu=$(grep -m1 "^\[cpu\]" "$log/info.log" | cut -c1-200)
    if [[ $cpu == "[cpu] native: the wheel's"* ]] && [ -z "$(awk -f "$repo/tools/cpu_ops_not_native.awk" "$log/info.log")" ]; then
      cpu="the wheel's, every op native, level ${cpu##*; level }"
    else
      cpu="**not the wheel's**: ${cpu#\[cpu\] }"
    fi
  else
  cpu_s=$( { seconds "$py" -m core_ops build >"$log/build-cpu.log" 2>&1; } 3>&1 )
  cpu=$(grep -m1 "^cpu:" "$log/build-cpu.log" | cut -c1-160)
  [[ $cpu == "cpu: ok: native"* ]] && cpu="build (${cpu_s} s)" || cpu="**fail**: ${cpu#cpu: }"
  fi
  if [ "$cuda" = 1 ] && "$py" -c "import torch, sys; sys.exit(torch.version.cuda is None)"; then
    # With [cuda], its compiler, as on a GPU machine without a toolkit: no CUDA_HOME and
    # no nvcc on PATH (the pip packages come before /usr/local/cuda in the search).
    local how="nvcc on PATH" build_env=(env)
    if [[ $extras == *cuda* ]]; then
      how="the [cuda] extra's nvcc"
      build_env=(env -u CUDA_HOME -u CUDA_PATH PATH="$(without_nvcc "$PATH")")
    fi
    cuda_s=$( { seconds "${build_env[@]}" "$py" -m core_ops build --cuda --arch 9.0 >"$log/build-cuda.log" 2>&1; } 3>&1 )
    cuda_col=$(grep -m1 "^cuda:" "$log/build-cuda.log" | cut -c1-200)
    if [[ $cuda_col == "cuda: ok: native"* ]]; then
      cuda_col="build, sm_90, ${how} (${cuda_s} s)"
    elif [[ $cuda_col == *"but this torch was built with CUDA"* || $cuda_col == *"no CUDA toolkit found"* ]]; then
      cuda_col="refused, as it should be: ${cuda_col#cuda: FAILED: }"  # no toolkit to match torch's CUDA here
    else
      cuda_col="**fail** (${how}): ${cuda_col#cuda: }"
    fi
  fi
  cd "$home/src" || return
  suite_s=$( { seconds "${run_env[@]}" "$(command -v timeout)" 5400 "$py" -m pytest -q -p no:cacheprovider -rfE "${subset[@]}" "${paths[@]}" \
    >"$log/suite.log" 2>&1; } 3>&1 )
  cd "$repo" || return
  summary=$(grep -E "(passed|failed|error).* in [0-9.]+s" "$log/suite.log" | tail -n 1 | tr -d '=' | sed -E 's/^ +| +$//g')
  [ -n "$summary" ] || summary="no summary: $(tail -n 1 "$log/suite.log" | cut -c1-120)"
  failures=$(grep -E "^(FAILED|ERROR) " "$log/suite.log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//' \
             | awk 'NR <= 30' | paste -sd ' ' -)
  if [ -n "$wheel" ] && [ -n "$(ls -A "$home/kernels")" ]; then
    failures="the cache was written: $(ls -A "$home/kernels" | head -3 | paste -sd ' ' -) ${failures}"
  fi
  local installed="core-ops[$extras]"
  [ -n "$wheel" ] && installed="$(basename "$wheel")"
  rows+=("| $version | torch ${torch_s} s, $installed + plugins ${install_s} s | $cpu | $cuda_col | $summary (${suite_s} s) | ${failures:--} |")
  unset CORE_OPS_CACHE_DIR
}

# Everything runs from functions, so that bash has read the whole file before the first
# step: an edit of this script during a run (an hour) cannot change what the run does.
main() {
  # Another machine's wheel runs under emulation, with a script of its own.
  [[ " $* " == *" --arch aarch64 "* ]] && exec bash "$repo/tools/compat_aarch64.sh" "$@"
  parse_args "$@"
  for release in "${releases[@]}"; do
    one_release "$release"
  done
  {
    echo "| torch | install | native CPU kernels | CUDA kernels | the suite${subset[*]:+ (${subset[*]})}${paths[*]:+ (${paths[*]})} | failed |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } | tee "$DIR/table.md"
}

main "$@"; exit $?
