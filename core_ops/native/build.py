"""Backend 2's build (Note [Backends] in native/__init__.py): the sources of ``csrc/``
into one library per device type, the CPU one with each kernel source once per x86-64
level, the CUDA one through ``torch.utils.cpp_extension``.

Note [CPU levels] (csrc/cpu/level.h) says what a level is and how the library picks
one when it loads. The wheel (tools/wheel.sh) compiles every level, a JIT build only
the highest this machine runs (or CORE_OPS_CPU_LEVEL, if lower), so building at first
use costs no more than one level. Both compile the same sources with the same flags
against torch's stable ABI (Note [Stable ABI] in csrc/include/core_ops/tensor.h).
The wheel's aarch64 library is built on x86-64 with a cross compiler, against an
aarch64 torch's headers and libtorch_cpu (a ``Cross``).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import settings
from . import cuda_toolkit, toolchain
from .toolchain import TARGET_FLAG

CSRC = Path(__file__).resolve().parent.parent / "csrc"

# Each machine's levels, name -> (CORE_OPS_CPU_LEVEL_ID, flags), lowest first (the link
# order, level.h's rule). aarch64 has one: Advanced SIMD (NEON), with its FMA and its
# half <-> float conversions, is part of ARMv8-A itself (Note [Vector levels]); a
# machine named in neither builds the portable code as "baseline".
MACHINE_LEVELS = {
    "x86_64": {
        "baseline": (0, []),
        "avx2": (1, ["-mavx2", "-mfma", "-mf16c"]),
        "avx512": (2, ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]),
    },
    "aarch64": {"neon": (0, [])},
}
_TORCH_CAPABILITY = {"AVX512": "avx512", "AVX2": "avx2"}


def machine() -> str:
    """This machine's name as the wheels' platform tags spell it (x86_64, aarch64, ...)."""
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def levels_of(name: str | None = None) -> dict[str, tuple[int, list[str]]]:
    """The levels of machine ``name`` (default: this one)."""
    return MACHINE_LEVELS.get(name or machine(), {"baseline": (0, [])})


LEVELS = levels_of()


@dataclass(frozen=True)
class Cross:
    """A CPU library for another machine: its compiler and the torch (a package folder,
    unpacked from that machine's wheel) whose headers and libtorch_cpu it builds against."""
    machine: str
    cxx: str
    torch_dir: Path


def sources(kind: str) -> list[Path]:
    """The CPU library's .cpp files; the CUDA library's .cu files and the .cpp files of
    its host-only code (compiled by the host compiler: nvcc is slower at it)."""
    folder = CSRC / kind
    if kind == "cpu":
        return sorted(folder.glob("*.cpp"))
    return sorted(folder.glob("*.cu")) + sorted(folder.glob("*.cpp"))


def is_x86() -> bool:
    return machine() == "x86_64"


def requested_level() -> str | None:
    """CORE_OPS_CPU_LEVEL (a setting: its value is checked where it is declared)."""
    return settings.core("cpu_level")


def host_level() -> str:
    """The level a JIT build compiles: the highest this CPU runs (as torch detected
    it), lowered to CORE_OPS_CPU_LEVEL when that is lower."""
    if not is_x86():
        return next(iter(LEVELS))
    level = _TORCH_CAPABILITY.get(torch.backends.cpu.get_cpu_capability(), "baseline")
    wanted = requested_level()
    if wanted in LEVELS and LEVELS[wanted][0] < LEVELS[level][0]:
        level = wanted
    return level


def _torch_dir(cross: Cross | None) -> Path:
    return cross.torch_dir if cross else Path(torch.__file__).parent


def common_flags(cross: Cross | None = None) -> list[str]:
    # -ffp-contract=off: each + and * rounds once, as in torch.optim's formulas and the
    # reference kernels; letting the compiler fuse them into FMAs moved results by an
    # ulp per step (Note [Adam as torch.optim computes it]). The kernels are bound by
    # memory, not arithmetic, so nothing is lost. Hidden visibility: the library
    # exports nothing (it registers its kernels with torch when loaded), so the CPU and
    # CUDA libraries never bind to each other's copies of an inline function.
    return ["-std=c++17", "-O3", "-fPIC", "-ffp-contract=off", "-fvisibility=hidden",
            "-fvisibility-inlines-hidden", TARGET_FLAG,
            f"-I{_torch_dir(cross) / 'include'}", f"-I{CSRC / 'include'}",
            *glibc_floor_flags(), *sanitizer_flags()]


def glibc_floor_flags() -> list[str]:
    """Note [glibc 2.28] (csrc/include/core_ops/glibc_floor.h): every source of both
    libraries reads it first (gcc's and nvcc's -include are the same option)."""
    return ["-include", str(CSRC / "include" / "core_ops" / "glibc_floor.h")]


def sanitizer_flags() -> list[str]:
    """CORE_OPS_SANITIZE=1 (settings.py): ASan and UBSan, an undefined operation fatal
    (so a test fails on it, not just a line in a log), frames kept for the reports.
    Part of the cache key, as every flag: a sanitized build has its own entry."""
    if settings.core("sanitize") != "1":
        return []
    return ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]


def level_flags(level: str, cross: Cross | None = None) -> list[str]:
    level_id, flags = levels_of(cross and cross.machine)[level]
    return [*flags, f"-DCORE_OPS_CPU_LEVEL={level}", f"-DCORE_OPS_CPU_LEVEL_ID={level_id}"]


def link_flags(cross: Cross | None = None) -> list[str]:
    # torch's stable C shims live in libtorch_cpu: the library names it (no rpath: the
    # copy torch already loaded is the one found).
    return ["-shared", f"-L{_torch_dir(cross) / 'lib'}", "-ltorch_cpu",
            *[f for f in sanitizer_flags() if f.startswith("-fsanitize=")]]


def kernel_sources() -> list[Path]:
    """Every CPU source compiled per level (register.cpp once, at the baseline)."""
    return sorted(p for p in (CSRC / "cpu").glob("*.cpp") if p.name != "register.cpp")


def hashed_parts(levels: list[str]) -> list[str]:
    """What changes the binary besides the sources: part of the cache key. Where the
    sources lie does not (a copy of them builds the same library)."""
    flags = [*common_flags(), *link_flags(), *(f for level in levels for f in level_flags(level))]
    return [f.replace(str(CSRC), "<csrc>") for f in flags]


def _ninja_file(cxx: str, levels: list[str], output: str, cross: Cross | None = None) -> str:
    q = shlex.quote
    known = levels_of(cross and cross.machine)
    lowest = next(iter(known))
    lines = [
        "ninja_required_version = 1.3",
        f"cxx = {q(cxx)}",
        f"cflags = {' '.join(q(f) for f in common_flags(cross))}",
        "rule cc",
        "  command = $cxx -MMD -MF $out.d $cflags $lflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $out",
        "rule link",
        f"  command = $cxx $in -o $out {' '.join(q(f) for f in link_flags(cross))}",
        "  description = link $out",
    ]
    objects = ["register.o"]
    lines += [f"build register.o: cc {q(str(CSRC / 'cpu' / 'register.cpp'))}",
              f"  lflags = {' '.join(level_flags(lowest, cross)[-2:])}"]
    for level in sorted(levels, key=lambda name: known[name][0]):  # the lowest first
        for source in kernel_sources():
            obj = f"{level}/{source.stem}.o"
            objects.append(obj)
            lines += [f"build {obj}: cc {q(str(source))}",
                      f"  lflags = {' '.join(q(f) for f in level_flags(level, cross))}"]
    lines += [f"build {output}: link {' '.join(objects)}", f"default {output}"]
    return "\n".join(lines) + "\n"


def cpu_library(library: Path, build_dir: Path, levels: list[str], cxx: str, ninja: str,
                jobs: int | None = None, verbose: bool = False, cross: Cross | None = None) -> None:
    """Compile and link the CPU library holding ``levels`` into ``library``
    (``build_dir`` keeps the objects, so a second build recompiles only what changed),
    for this machine or ``cross``'s."""
    known = levels_of(cross and cross.machine)
    unknown = [level for level in levels if level not in known]
    if unknown or not levels:
        raise ValueError(f"levels must be some of {', '.join(known)} on {(cross and cross.machine) or machine()}, "
                         f"got {levels!r}")
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "build.ninja").write_text(_ninja_file(cxx, levels, library.name, cross))
    cmd = [ninja, "-C", str(build_dir)]
    if jobs:
        cmd += ["-j", str(jobs)]
    if verbose:
        cmd.append("-v")
    result = subprocess.run(cmd, capture_output=not verbose, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"CPU build failed:\n{(result.stdout or '')[-6000:]}{(result.stderr or '')[-2000:]}")
    built = build_dir / library.name
    if built != library:
        os.replace(built, library)


def cuda_flags() -> list[str]:
    # No --use_fast_math: the non-finite probe needs IEEE inf/nan (Note [Non-finite probe]).
    # -fmad=false: as -ffp-contract=off on the CPU (common_flags), each * and + rounds once,
    # so a CUDA kernel rounds exactly as the CPU kernel running the same math header
    # does, and the two agree bit for bit; nvcc's default contraction into FMAs moved
    # results by an ulp a step, differently per op. Division and sqrt stay IEEE
    # (-prec-div / -prec-sqrt default to true). The kernels are bound by memory.
    # Hidden visibility: as the CPU library's (common_flags), nothing exported.
    return ["-O3", "--expt-relaxed-constexpr", "-lineinfo", "-fmad=false", "-Xcompiler=-fvisibility=hidden",
            TARGET_FLAG, *glibc_floor_flags()]


def cuda_host_flags() -> list[str]:
    """The CUDA library's host-only .cpp sources: as common_flags' for the CPU library."""
    return ["-O3", "-fvisibility=hidden", TARGET_FLAG, *glibc_floor_flags()]


def cuda_library(name: str, build_dir: Path, arch: str | None) -> None:
    """Compile and link the CUDA library ``build_dir / f"{name}.so"``."""
    home = toolchain.cuda_home()
    if home is None:
        raise RuntimeError("no CUDA toolkit found (no nvcc on PATH and CUDA_HOME unset)")
    if not os.environ.get("CUDA_HOME"):
        # Set before cpp_extension is imported: it resolves CUDA_HOME once, at import,
        # from the nvcc wrapper's folder, which is not the toolkit.
        os.environ["CUDA_HOME"] = home
    # Without a GPU, importing cpp_extension logs "No CUDA runtime is found": true,
    # and irrelevant to building, so it is not shown.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = home  # in case it was imported before this call
    os.environ["TORCH_CUDA_ARCH_LIST"] = toolchain.cuda_archs(arch)
    # torch's wheels keep the headers of their CUDA libraries (cuDNN, NCCL, ...) in
    # site-packages/nvidia/*/include; the runtime's (nvidia/cu13) only when it is the
    # toolkit too: beside another toolkit they are a second CUDA release's headers,
    # which CCCL refuses (a 13.0 nvcc with torch 2.15's 13.2 runtime).
    runtime = cuda_toolkit.pip_runtime()
    includes = [str(CSRC / "include")]
    includes += [str(p) for p in cuda_toolkit.site_nvidia().glob("*/include")
                 if p.parent != runtime or Path(home).resolve() == runtime.resolve()]
    pip_includes, link_flags = cuda_toolkit.build_flags(home, build_dir)
    includes += [p for p in pip_includes if p not in includes]
    with toolchain.ninja_on_path():
        cpp_extension.load(
            name=name,
            sources=[str(s) for s in sources("cuda")],
            extra_include_paths=includes,
            build_directory=str(build_dir),
            is_python_module=False,
            with_cuda=True,
            verbose=settings.core("verbose_build") == "1",
            extra_cflags=cuda_host_flags(),
            extra_cuda_cflags=cuda_flags(),
            extra_ldflags=link_flags,
        )


def gencode_flags(archs: str) -> list[str]:
    """nvcc's -gencode for "8.0;9.0;12.0+PTX": SASS for each, PTX for those marked."""
    flags = []
    for arch in archs.replace(",", ";").split(";"):
        number = arch.replace("+PTX", "").replace(".", "").strip()
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


def cuda_library_cross(library: Path, build_dir: Path, archs: str, cross: Cross, cudart: Path,
                       ninja: str, jobs: int | None = None) -> None:
    """The CUDA library for ``cross``'s machine, built here: this machine's nvcc compiles
    the device code (the same SASS whatever the host) and hands the host code to
    ``cross.cxx``; the CUDA headers are this toolkit's (one release's headers are the
    same on every host); it links against ``cross.torch_dir``'s libraries and the
    ``cudart`` file of that machine's CUDA runtime. The flags are those of
    ``cuda_library`` (cpp_extension's defines for halves included)."""
    from torch.utils import cpp_extension

    home = Path(toolchain.cuda_home() or "")
    if not (home / "bin" / "nvcc").is_file():
        raise RuntimeError("the cross build needs a CUDA toolkit here (CUDA_HOME)")
    headers = next((d for d in [home / "include", *sorted((home / "targets").glob("*/include"))]
                    if (d / "cuda_runtime.h").is_file()), None)
    if headers is None:
        raise RuntimeError(f"no cuda_runtime.h under {home}")
    q = shlex.quote
    torch_include = cross.torch_dir / "include"
    includes = [f"-I{CSRC / 'include'}", "-isystem", str(torch_include), "-isystem", str(headers),
                "-isystem", str(headers / "cccl")]
    nvcc = [str(home / "bin" / "nvcc"), "-ccbin", cross.cxx, *includes, *cpp_extension.COMMON_NVCC_FLAGS,
            *gencode_flags(archs), "--compiler-options=-fPIC", "-std=c++17", *cuda_flags()]
    cxx = [cross.cxx, *includes, "-fPIC", "-std=c++17", *cuda_host_flags()]
    # --no-undefined: every symbol the library calls is in the libraries it names, as
    # they are on the machine it is for.
    link = ["-shared", "-Wl,--no-undefined", f"-L{cross.torch_dir / 'lib'}", "-ltorch_cpu", "-ltorch_cuda",
            "-lc10", str(cudart)]
    lines = ["ninja_required_version = 1.3",
             "rule cu", f"  command = {' '.join(q(f) for f in nvcc)} -c $in -o $out",
             "rule cc", f"  command = {' '.join(q(f) for f in cxx)} -c $in -o $out",
             "rule link", f"  command = {q(cross.cxx)} $in -o $out {' '.join(q(f) for f in link)}"]
    objects = []
    for source in sources("cuda"):
        objects.append(f"{source.name}.o")
        lines.append(f"build {source.name}.o: {'cu' if source.suffix == '.cu' else 'cc'} {q(str(source))}")
    lines += [f"build {library.name}: link {' '.join(objects)}", f"default {library.name}"]
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "build.ninja").write_text("\n".join(lines) + "\n")
    result = subprocess.run([ninja, "-C", str(build_dir), *(["-j", str(jobs)] if jobs else [])],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"CUDA cross build failed:\n{result.stdout[-6000:]}{result.stderr[-2000:]}")
    os.replace(build_dir / library.name, library)


def library(kind: str, name: str, build_dir: Path, arch: str | None) -> None:
    """Compile ``kind``'s library for this machine into ``build_dir / f"{name}.so"``."""
    if kind == "cpu":
        cpu_library(build_dir / f"{name}.so", build_dir, [host_level()], toolchain.cxx(), toolchain.ninja(),
                    jobs=toolchain.usable_cores(), verbose=settings.core("verbose_build") == "1")
    else:
        cuda_library(name, build_dir, arch)


def cause(error: Exception) -> str:
    """The line of a build error that says what went wrong: the compiler's or linker's
    first error line, not ninja's first line (the whole compiler command)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if _DIAGNOSTIC.search(line) and not line.lower().startswith("error building extension"):
            return line[:300]
    return lines[-1][:300] if lines else type(error).__name__


# gcc / clang "file:1:2: error: ...", nvcc "file.cu(3): error: ...", "error #20: ...",
# ld's "undefined reference"; a bare "error" may be in a path.
_DIAGNOSTIC = re.compile(r"\berror\s*(#\d+)?\s*:|fatal error|undefined reference", re.IGNORECASE)
