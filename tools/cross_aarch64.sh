# What building and running the aarch64 wheel on an x86-64 machine needs, sourced by
# tools/wheel.sh (--arch aarch64) and tools/compat.sh (--arch aarch64). Everything
# downloaded is kept in $CROSS_DIR (default ~/.cache/core-ops-cross), so a second run
# downloads nothing.
#
#   cross_toolchain          aarch64-linux-gnu-g++ (Debian's crossbuild-essential-arm64)
#   cross_torch PYTHON       the aarch64 wheels of PYTHON's torch and of its CUDA runtime,
#                            unpacked: sets CROSS_TORCH (the torch package folder) and
#                            CROSS_CUDART (libcudart.so.<major>)
#   cross_tree               an arm64 Debian tree with python3.11 (mmdebstrap) and
#                            qemu-aarch64: sets CROSS_ROOT
#   cross_site SPEC...       pip packages for that python (torch's aarch64 wheel and its
#                            dependencies), installed into a folder: sets CROSS_SITE
#   cross_python ARGS...     runs the tree's python under qemu-aarch64
CROSS_DIR=${CROSS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/core-ops-cross}
# pip's --platform takes tags one by one: every manylinux_2_x a glibc 2.36 system (the
# tree's, Debian 12) installs. NVIDIA's aarch64 wheels use several of them.
CROSS_PLATFORMS=(--platform manylinux2014_aarch64 --platform linux_aarch64)
for _minor in $(seq 17 36); do CROSS_PLATFORMS+=(--platform "manylinux_2_${_minor}_aarch64"); done
CROSS_PY=3.11  # the tree's python (Debian 12)

_cross_apt() {
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] \
    || { echo "cross: install Debian's $* (apt-get, as root)" >&2; return 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >"$CROSS_DIR/apt.log" 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" \
         >"$CROSS_DIR/apt.log" 2>&1; } \
    || { echo "cross: apt-get install $* failed ($CROSS_DIR/apt.log)" >&2; return 1; }
}

cross_toolchain() {
  mkdir -p "$CROSS_DIR"
  command -v aarch64-linux-gnu-g++ >/dev/null || _cross_apt crossbuild-essential-arm64
}

_cross_pip() {  # the host's pip, choosing aarch64 wheels for the tree's python
  "${PYTHON:-python3}" -m pip --disable-pip-version-check -q "$1" --only-binary=:all: "${CROSS_PLATFORMS[@]}" \
    --python-version "$CROSS_PY" --implementation cp "${@:2}"
}

cross_torch() {
  local python=$1 version cuda folder
  version=$("$python" -c "import torch; print(torch.__version__.split('+')[0])")
  cuda=$("$python" -c "import torch; print((torch.version.cuda or '').split('.')[0])")
  folder="$CROSS_DIR/torch-$version"
  if [ ! -f "$folder/.unpacked" ]; then
    echo "cross: downloading torch $version for aarch64 (once, into $folder)" >&2
    rm -rf "$folder" && mkdir -p "$folder/wheels"
    PYTHON=$python _cross_pip download --no-deps -d "$folder/wheels" "torch==$version" \
      || { echo "cross: no aarch64 wheel of torch $version" >&2; return 1; }
    # torch's wheel pins NVIDIA's runtime through cuda-toolkit[cudart]: the same release.
    if [ -n "$cuda" ]; then
      PYTHON=$python _cross_pip download --no-deps -d "$folder/wheels" "nvidia-cuda-runtime==$("$python" -c \
        "import importlib.metadata as m; print(m.version('nvidia-cuda-runtime'))")" \
        || { echo "cross: no aarch64 wheel of the CUDA runtime" >&2; return 1; }
    fi
    for w in "$folder"/wheels/*.whl; do
      "$python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$folder/site" \
        || return 1
    done
    touch "$folder/.unpacked"
  fi
  CROSS_TORCH="$folder/site/torch"
  CROSS_CUDART=$(ls "$folder"/site/nvidia/cu*/lib/libcudart.so.* 2>/dev/null | head -n 1)
  export CROSS_TORCH CROSS_CUDART
}

cross_tree() {
  mkdir -p "$CROSS_DIR"
  command -v qemu-aarch64 >/dev/null || _cross_apt qemu-user || return 1
  command -v mmdebstrap >/dev/null || _cross_apt mmdebstrap || return 1
  CROSS_ROOT="$CROSS_DIR/debian-arm64"
  export CROSS_ROOT
  # python for the wheel's run; g++, dash (ninja runs each command with /bin/sh) and
  # coreutils for the JIT route's build in a chroot of the tree (openssl and Python.h:
  # inductor's C++ code, which the tests compile where a compiler is).
  local packages=python3.11,libpython3.11-stdlib,libstdc++6,libgcc-s1,zlib1g,libgomp1,g++,libc6-dev,dash,coreutils,openssl,libpython3.11-dev
  [ "$(cat "$CROSS_ROOT/.made" 2>/dev/null)" = "$packages" ] && return 0
  echo "cross: making an arm64 Debian 12 tree (once, into $CROSS_ROOT)" >&2
  mkdir -p "$CROSS_ROOT"
  # extract: the packages unpacked, no maintainer script run (they would need arm64
  # binaries to run on this machine, which qemu does only when called for each one).
  # Unpacked over an older tree, which keeps what was installed into it (/opt).
  mmdebstrap --quiet --mode=unshare --architectures=arm64 --variant=extract --include="$packages" \
    bookworm "$CROSS_DIR/debian-arm64.tar" http://deb.debian.org/debian >"$CROSS_DIR/mmdebstrap.log" 2>&1 \
    || { echo "cross: mmdebstrap failed ($CROSS_DIR/mmdebstrap.log)" >&2; return 1; }
  tar -xf "$CROSS_DIR/debian-arm64.tar" -C "$CROSS_ROOT" && rm -f "$CROSS_DIR/debian-arm64.tar"
  # dash's maintainer script would make /bin/sh.
  [ -e "$CROSS_ROOT/bin/sh" ] || ln -s dash "$CROSS_ROOT/bin/sh"
  # qemu-user reads a path first under its -L root: there the CPU described to torch's
  # cpuinfo (which parses /proc/cpuinfo and crashes on the x86 one) is an aarch64 one,
  # a Neoverse V2 (Grace) with two cores; a chroot of the tree sees these files only.
  mkdir -p "$CROSS_ROOT/proc"
  for i in 0 1; do
    printf 'processor\t: %d\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb dcpodp flagm2 frint i8mm bf16\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\nCPU revision\t: 0\n\n' "$i"
  done >"$CROSS_ROOT/proc/cpuinfo"
  # In a chroot of the tree (the JIT route) nothing falls back to the host's /sys.
  mkdir -p "$CROSS_ROOT/sys/devices/system/cpu"
  for f in possible present online; do echo 0-1 >"$CROSS_ROOT/sys/devices/system/cpu/$f"; done
  for i in 0 1; do
    mkdir -p "$CROSS_ROOT/sys/devices/system/cpu/cpu$i/regs/identification"
    echo 0x00000000410fd4f0 >"$CROSS_ROOT/sys/devices/system/cpu/cpu$i/regs/identification/midr_el1"
  done
  echo "$packages" >"$CROSS_ROOT/.made"
}

cross_site() {
  CROSS_SITE=$1; shift
  export CROSS_SITE
  [ -f "$CROSS_SITE/.installed" ] && [ "$(cat "$CROSS_SITE/.installed")" = "$*" ] && return 0
  echo "cross: installing $* for the tree's python (aarch64 wheels, into $CROSS_SITE)" >&2
  rm -rf "$CROSS_SITE"
  _cross_pip install --target "$CROSS_SITE" "$@" >"$CROSS_DIR/pip.log" 2>&1 \
    || { tail -n 5 "$CROSS_DIR/pip.log" >&2; echo "cross: pip failed ($CROSS_DIR/pip.log)" >&2; return 1; }
  echo "$*" >"$CROSS_SITE/.installed"
}

cross_python() {
  # QEMU_LD_PREFIX: the same root for a python the tests start themselves, where
  # binfmt_misc runs it through qemu.
  PYTHONPATH="$CROSS_SITE${PYTHONPATH:+:$PYTHONPATH}" QEMU_LD_PREFIX="$CROSS_ROOT" \
    qemu-aarch64 -L "$CROSS_ROOT" "$CROSS_ROOT/usr/bin/python3.11" "$@"
}
