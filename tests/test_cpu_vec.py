"""core_ops/csrc/cpu/vec.h, the kernels' own vector layer, at every level this machine
runs: tests/support/vec_check.cpp compiled with the CPU library's flags for the level
(core_ops/native/build.py) checks each operation against scalar code, bit for bit on
edge values (Note [Vector results as at::vec] in vec.h). "generic" is the baseline
build with no intrinsics (CORE_OPS_VEC_GENERIC): the vector-extension code aarch64 and
other CPUs compile, run here. "neon" is aarch64's level itself, NEON instructions
included, built by the cross compiler and run under qemu-aarch64 (where both are
installed: Debian's crossbuild-essential-arm64 and qemu-user), against torch's scalar
conversions as they compile for aarch64."""

import concurrent.futures
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from core_ops.native import build, toolchain

CHECK = Path(__file__).parent / "support" / "vec_check.cpp"
CPU_SOURCES = build.CSRC / "cpu"

# The x86-64 levels this CPU runs, as torch detected them.
_RUNS = {"DEFAULT": ["baseline"], "AVX2": ["baseline", "avx2"], "AVX512": ["baseline", "avx2", "avx512"]}
RUNNABLE = _RUNS.get(torch.backends.cpu.get_cpu_capability(), ["baseline"]) if build.is_x86() else ["baseline"]
VARIANTS = ["baseline", "generic", "avx2", "avx512", "neon"]
# aarch64's level from this x86-64 machine: the cross compiler, and qemu to run it with
# the cross toolchain's aarch64 libraries.
CROSS_CXX = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")
CROSS_ROOT = "/usr/aarch64-linux-gnu"


def _flags(variant):
    if variant == "neon":
        return [*build.common_flags(), *build.level_flags("neon", build.Cross("aarch64", CROSS_CXX, Path())),
                f"-I{CPU_SOURCES}"]
    level = "baseline" if variant == "generic" else variant
    extra = ["-DCORE_OPS_VEC_GENERIC"] if variant == "generic" else []
    return [*build.common_flags(), *build.level_flags(level), *extra, f"-I{CPU_SOURCES}"]


def _runs_here(variant):
    if variant == "neon":
        return build.machine() == "aarch64" or (CROSS_CXX is not None and QEMU is not None and build.is_x86())
    return variant == "generic" or variant in RUNNABLE


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """{variant: the compiled check, or the compiler's error}, compiled side by side."""
    cxx = toolchain.cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (c++ or $CXX) to build the vector checks with")
    folder = tmp_path_factory.mktemp("vec")
    wanted = [v for v in VARIANTS if _runs_here(v)]

    def compile_one(variant):
        out = folder / f"vec_check_{variant}"
        compiler = CROSS_CXX if variant == "neon" and build.is_x86() else cxx
        done = subprocess.run([compiler, *_flags(variant), str(CHECK), "-o", str(out)], capture_output=True, text=True)
        return variant, out if done.returncode == 0 else done.stderr[-4000:]

    with concurrent.futures.ThreadPoolExecutor(len(wanted)) as pool:
        return dict(pool.map(compile_one, wanted))


@pytest.mark.parametrize("variant", VARIANTS)
def test_vector_ops_match_scalar(programs, variant):
    if variant not in programs:
        if variant == "neon":
            pytest.skip("the neon level needs aarch64-linux-gnu-g++ and qemu-aarch64 here "
                        "(apt-get install crossbuild-essential-arm64 qemu-user)")
        pytest.skip(f"this CPU does not run the {variant} level" if build.is_x86() else
                    f"{variant} is an x86-64 level")
    program = programs[variant]
    assert isinstance(program, Path), f"vec_check.cpp did not compile at {variant}:\n{program}"
    command = [str(program), variant]
    if variant == "neon" and build.is_x86():
        command = [QEMU, "-L", CROSS_ROOT, *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    summary = re.search(r"vec_check (\w+) lanes=(\d+) checks=(\d+) failures=(\d+)", run.stdout)
    assert summary is not None, f"no summary from the check:\n{run.stdout}\n{run.stderr}"
    level, lanes, checks, failures = summary.group(1), int(summary.group(2)), int(summary.group(3)), int(summary.group(4))
    assert level == variant
    assert lanes == (16 if variant == "avx512" else 8)
    assert checks > 8_000_000  # every 16-bit pattern, ~850k floats per conversion, the ops' lanes
    assert failures == 0 and run.returncode == 0, run.stdout[-4000:]


def test_every_cpu_source_compiles_for_aarch64(tmp_path):
    """The CPU library's sources at aarch64's level (no x86 intrinsic outside the x86
    levels' own files): each compiled by the cross compiler against this torch's headers
    (the aarch64 wheel's link step and its tests under qemu: tools/wheel.sh --arch and
    tools/compat.sh --arch, docs/kernels.md)."""
    if CROSS_CXX is None:
        pytest.skip("needs aarch64-linux-gnu-g++ (apt-get install crossbuild-essential-arm64)")
    cross = build.Cross("aarch64", CROSS_CXX, Path(torch.__file__).parent)
    sources = [build.CSRC / "cpu" / "register.cpp", *build.kernel_sources()]

    def compile_one(source):
        flags = [*build.common_flags(cross), *build.level_flags("neon", cross)]
        done = subprocess.run([CROSS_CXX, *flags, "-c", str(source), "-o", str(tmp_path / f"{source.stem}.o")],
                              capture_output=True, text=True)
        return source.name, done.returncode, done.stderr[-3000:]

    with concurrent.futures.ThreadPoolExecutor(toolchain.usable_cores()) as pool:
        results = list(pool.map(compile_one, sources))
    assert len(results) == 13
    failed = [(name, err) for name, rc, err in results if rc != 0]
    assert not failed, failed
    header = (tmp_path / "adam.o").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
