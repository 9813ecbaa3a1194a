"""What backend 2 (Note [Backends] in native/__init__.py) compiles with: the C++
compiler, ninja and, for CUDA, the toolkit (Note [CUDA toolkit from pip] in
cuda_toolkit.py), and why a library cannot be built here when one is missing."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import torch

from .. import settings
from . import cuda_toolkit

DEFAULT_CUDA_ARCHS = "8.0;9.0"

# The oldest torch the libraries load on; TORCH_TARGET_VERSION holds it as torch's
# headeronly/version.h encodes releases: the major in the top byte, the minor in the next.
TARGET_TORCH = (2, 10)
TARGET_FLAG = f"-DTORCH_TARGET_VERSION=0x{TARGET_TORCH[0]:02x}{TARGET_TORCH[1]:02x}{0:012x}"


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.14.1+cu130" -> (2, 14))."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++"))


def version_line(cmd: list[str]) -> str:
    """The line of ``cmd``'s output that names its version ("" if it does not run)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if "nvcc" in cmd[0] else (lines[0] if lines else "")


def cuda_home() -> str | None:
    """The CUDA toolkit root (Note [CUDA toolkit from pip] in cuda_toolkit.py)."""
    return cuda_toolkit.find_root()


def cuda_archs(arch: str | None = None) -> str:
    """The archs a CUDA build targets: ``arch``, else CORE_OPS_CUDA_ARCH, else
    TORCH_CUDA_ARCH_LIST, else the GPUs present, else DEFAULT_CUDA_ARCHS."""
    wanted = arch or settings.core("cuda_arch") or os.environ.get("TORCH_CUDA_ARCH_LIST")
    if wanted:
        return wanted
    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))
    return DEFAULT_CUDA_ARCHS


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _pip_ninja_folder() -> str | None:
    """The folder of the ninja the pip package (a dependency) installs into the
    environment's bin folder. torch's cpp_extension runs the ``ninja`` on PATH, and
    that folder is not on PATH when the environment's python runs unactivated
    (``.venv/bin/python``), so ``ninja_on_path`` puts it there for the build."""
    try:
        import ninja as pip_ninja
    except ImportError:
        return None
    folder = getattr(pip_ninja, "BIN_DIR", None)
    return folder if folder and shutil.which("ninja", path=folder) else None


def ninja() -> str | None:
    """The ninja to run: the one on PATH, else the pip package's."""
    return shutil.which("ninja") or shutil.which("ninja", path=_pip_ninja_folder() or "")


@contextlib.contextmanager
def ninja_on_path():
    """PATH with pip's ninja folder in front while the build runs (only if no ninja
    is on PATH), and as it was afterwards."""
    folder = None if shutil.which("ninja") else _pip_ninja_folder()
    if folder is None:
        yield
        return
    before = os.environ.get("PATH")
    os.environ["PATH"] = folder + os.pathsep + (before or "")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def missing(kind: str) -> str | None:
    """Why a native library for ``kind`` cannot be built here, or None."""
    if release(torch.__version__) < TARGET_TORCH:
        return (f"torch {torch.__version__} is older than the kernels' stable ABI target "
                f"({'.'.join(map(str, TARGET_TORCH))}); pip install 'torch>=2.10'")
    if cxx() is None:  # nvcc needs the host compiler too
        return "no C++ compiler found (set CXX or install g++)"
    if kind == "cuda":
        if torch.version.cuda is None:
            return "this PyTorch build has no CUDA"
        home = cuda_home()
        if home is None:
            return ("no CUDA toolkit found (no nvcc on PATH, CUDA_HOME unset, no pip-installed compiler): "
                    + cuda_toolkit.install_hint())
        problem = cuda_toolkit.mismatch(home)
        if problem:
            return problem
    if not ninja():
        return "ninja not found (pip install ninja)"
    return None
