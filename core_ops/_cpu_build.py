"""Compiling the CPU library: each kernel source once per x86-64 level, one library.

Note [CPU levels] (csrc/cpu/level.h) says what a level is and how the library picks
one when it loads. This module turns a list of levels into compiler commands and
runs them with ninja: the wheel (tools/wheel.sh) compiles every level, a JIT build
only the highest this machine runs (or CORE_OPS_CPU_LEVEL, if lower), so building at
first use costs no more than one level. Both compile the same sources with the same
flags against torch's stable ABI (Note [Stable ABI] in csrc/include/core_ops/tensor.h).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from pathlib import Path

import torch

from . import settings

CSRC = Path(__file__).resolve().parent / "csrc"

# The oldest torch the libraries load on; TORCH_TARGET_VERSION holds it as torch's
# headeronly/version.h encodes releases: the major in the top byte, the minor in the next.
TARGET_TORCH = (2, 10)
TARGET_FLAG = f"-DTORCH_TARGET_VERSION=0x{TARGET_TORCH[0]:02x}{TARGET_TORCH[1]:02x}{0:012x}"

# name -> (CORE_OPS_CPU_LEVEL_ID, flags), lowest first (the link order, level.h's rule).
LEVELS = {
    "baseline": (0, []),
    "avx2": (1, ["-mavx2", "-mfma", "-mf16c"]),
    "avx512": (2, ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]),
}
_TORCH_CAPABILITY = {"AVX512": "avx512", "AVX2": "avx2"}


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.14.1+cu130" -> (2, 14))."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def requested_level() -> str | None:
    """CORE_OPS_CPU_LEVEL (a setting: its value is checked where it is declared)."""
    return settings.core("cpu_level")


def host_level() -> str:
    """The level a JIT build compiles: the highest this CPU runs (as torch detected
    it), lowered to CORE_OPS_CPU_LEVEL when that is lower."""
    if not is_x86():
        return "baseline"
    level = _TORCH_CAPABILITY.get(torch.backends.cpu.get_cpu_capability(), "baseline")
    wanted = requested_level()
    if wanted in LEVELS and LEVELS[wanted][0] < LEVELS[level][0]:
        level = wanted
    return level


def common_flags() -> list[str]:
    # -ffp-contract=off: each + and * rounds once, as in torch.optim's formulas and the
    # reference kernels; letting the compiler fuse them into FMAs moved results by an
    # ulp per step (Note [Adam as torch.optim computes it]). The kernels are bound by
    # memory, not arithmetic, so nothing is lost. Hidden visibility: the library
    # exports nothing (it registers its kernels with torch when loaded), so the CPU and
    # CUDA libraries never bind to each other's copies of an inline function.
    return ["-std=c++17", "-O3", "-fPIC", "-ffp-contract=off", "-fvisibility=hidden",
            "-fvisibility-inlines-hidden", TARGET_FLAG,
            f"-I{Path(torch.__file__).parent / 'include'}", f"-I{CSRC / 'include'}", *sanitizer_flags()]


def sanitizer_flags() -> list[str]:
    """CORE_OPS_SANITIZE=1 (settings.py): ASan and UBSan, an undefined operation fatal
    (so a test fails on it, not just a line in a log), frames kept for the reports.
    Part of the cache key, as every flag: a sanitized build has its own entry."""
    if settings.core("sanitize") != "1":
        return []
    return ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]


def level_flags(level: str) -> list[str]:
    level_id, flags = LEVELS[level]
    return [*flags, f"-DCORE_OPS_CPU_LEVEL={level}", f"-DCORE_OPS_CPU_LEVEL_ID={level_id}"]


def link_flags() -> list[str]:
    # torch's stable C shims live in libtorch_cpu: the library names it (no rpath: the
    # copy torch already loaded is the one found).
    return ["-shared", f"-L{Path(torch.__file__).parent / 'lib'}", "-ltorch_cpu",
            *[f for f in sanitizer_flags() if f.startswith("-fsanitize=")]]


def kernel_sources() -> list[Path]:
    """Every CPU source compiled per level (register.cpp once, at the baseline)."""
    return sorted(p for p in (CSRC / "cpu").glob("*.cpp") if p.name != "register.cpp")


def hashed_parts(levels: list[str]) -> list[str]:
    """What changes the binary besides the sources: part of the cache key."""
    return [*common_flags(), *link_flags(), *(f for level in levels for f in level_flags(level))]


def _ninja_file(cxx: str, levels: list[str], output: str) -> str:
    q = shlex.quote
    lines = [
        "ninja_required_version = 1.3",
        f"cxx = {q(cxx)}",
        f"cflags = {' '.join(q(f) for f in common_flags())}",
        "rule cc",
        "  command = $cxx -MMD -MF $out.d $cflags $lflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $out",
        "rule link",
        f"  command = $cxx $in -o $out {' '.join(q(f) for f in link_flags())}",
        "  description = link $out",
    ]
    objects = ["register.o"]
    lines += [f"build register.o: cc {q(str(CSRC / 'cpu' / 'register.cpp'))}",
              f"  lflags = {' '.join(level_flags('baseline')[-2:])}"]
    for level in sorted(levels, key=lambda name: LEVELS[name][0]):  # baseline first
        for source in kernel_sources():
            obj = f"{level}/{source.stem}.o"
            objects.append(obj)
            lines += [f"build {obj}: cc {q(str(source))}",
                      f"  lflags = {' '.join(q(f) for f in level_flags(level))}"]
    lines += [f"build {output}: link {' '.join(objects)}", f"default {output}"]
    return "\n".join(lines) + "\n"


def build(library: Path, build_dir: Path, levels: list[str], cxx: str, ninja: str,
          jobs: int | None = None, verbose: bool = False) -> None:
    """Compile and link the CPU library holding ``levels`` into ``library``
    (``build_dir`` keeps the objects, so a second build recompiles only what changed)."""
    unknown = [level for level in levels if level not in LEVELS]
    if unknown or not levels:
        raise ValueError(f"levels must be some of {', '.join(LEVELS)}, got {levels!r}")
    if not is_x86() and levels != ["baseline"]:
        raise ValueError(f"{platform.machine()} has only the baseline level, got {levels!r}")
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "build.ninja").write_text(_ninja_file(cxx, levels, library.name))
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
