"""Finding the CUDA compiler the CUDA kernels build with (Note [Native build] in cache.py).

Note [CUDA toolkit from pip]: torch's pip wheels carry the CUDA runtime but no
compiler, so most GPU machines have no toolkit. NVIDIA ships the compiler as pip
packages too (nvidia-cuda-nvcc, -crt, -cccl, nvidia-nvvm, and the runtime torch already
pulls in). ``core-ops[cuda]`` asks for them through NVIDIA's ``cuda-toolkit[nvcc,cccl]``
with no version: torch's CUDA 13 wheels pin ``cuda-toolkit`` to their own release
(2.14.1: 13.0.3, 2.15.0: 13.2.2), so pip takes the compiler of torch's release, the
one whose headers match the runtime's (CCCL refuses any other pair). From CUDA 13
the packages all unpack into one root,
``site-packages/nvidia/cu<major>/`` (bin/nvcc, nvvm/, include/, lib/). That root
is a toolkit with two gaps the build fills: its nvcc.profile points the include path
at ``targets/<arch>/include``, which the pip layout lacks (the build adds
``include`` and ``include/cccl``, where cuda_fp16.h's ``nv/target`` lives), and its
``lib/`` holds ``libcudart.so.13`` with no unversioned ``libcudart.so`` for the
linker's ``-lcudart`` (the build links through a folder of its own holding that
name). The order of search: $CUDA_HOME / $CUDA_PATH, the nvcc on PATH, the pip root
for torch's CUDA major version, /usr/local/cuda.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch


def site_nvidia() -> Path:
    return Path(torch.__file__).resolve().parent.parent / "nvidia"


def pip_runtime() -> Path | None:
    """Where the pip packages of torch's CUDA major version unpack (nvidia/cu13): the
    CUDA runtime torch's wheel pulls in and, with the [cuda] extra, the compiler."""
    if torch.version.cuda is None:
        return None
    return site_nvidia() / f"cu{torch.version.cuda.split('.')[0]}"


def pip_root() -> Path | None:
    """The pip packages' toolkit root for torch's CUDA major version, if nvcc is in it."""
    root = pip_runtime()
    return root if root is not None and (root / "bin" / "nvcc").is_file() else None


def find_root() -> str | None:
    """The CUDA toolkit root, in the order of Note [CUDA toolkit from pip].

    nvcc on PATH is often a wrapper script (as here) so its folder's parent is not
    the toolkit; ``nvcc --dryrun`` prints the real root as ``TOP=``.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                                 capture_output=True, text=True, timeout=30)
            for line in (out.stdout + out.stderr).splitlines():
                if "TOP=" in line:
                    return os.path.normpath(line.split("TOP=", 1)[1].strip())
        except (OSError, subprocess.SubprocessError):
            pass
        root = Path(nvcc).resolve().parent.parent
        if (root / "include" / "cuda_runtime.h").exists():
            return str(root)
    pip = pip_root()
    if pip is not None:
        return str(pip)
    if Path("/usr/local/cuda/include/cuda_runtime.h").exists():
        return "/usr/local/cuda"
    return None


def release(home: str) -> str | None:
    """The CUDA release of the nvcc in ``home`` ("13.0"), or None if it does not run."""
    try:
        out = subprocess.run([os.path.join(home, "bin", "nvcc"), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def headers_release(include: Path) -> str | None:
    """The CUDA release of the runtime headers in ``include`` ("13.2"), or None."""
    try:
        text = (include / "cuda_runtime_api.h").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    if not match:
        return None
    version = int(match.group(1))
    return f"{version // 1000}.{version % 1000 // 10}"


def install_hint() -> str:
    """What to install for a compiler of this torch's CUDA release."""
    cuda = torch.version.cuda
    major = cuda.split(".")[0]
    if int(major) >= 13:
        return (f'pip install "cuda-toolkit[nvcc,cccl]=={cuda}.*" (core-ops[cuda] installs that beside a torch '
                f"wheel pinning cuda-toolkit), or set CUDA_HOME to a CUDA {cuda} toolkit")
    return (f"set CUDA_HOME to a CUDA {major}.x toolkit ({cuda} as torch), from NVIDIA or conda (NVIDIA's "
            f"CUDA {major} pip packages carry ptxas but no nvcc)")


def mismatch(home: str) -> str | None:
    """Why the compiler in ``home`` cannot build for this torch, or None: its CUDA major
    version must be torch's (a minor version apart is fine, as torch's own check says),
    and the runtime headers beside it its own release (CCCL refuses any other: the pip
    packages of two releases can share one root)."""
    found, wanted = release(home), torch.version.cuda
    if found is None:
        return f"the nvcc in {home} does not run"
    if wanted is not None and found.split(".")[0] != wanted.split(".")[0]:
        return (f"the CUDA compiler in {home} is CUDA {found} but this torch was built with CUDA {wanted}: "
                + install_hint())
    apart = pip_packages_apart(home)
    if apart:
        return apart
    headers = headers_release(Path(home) / "include")
    if wanted is not None and headers is not None and headers != found:
        return (f"the CUDA compiler in {home} is CUDA {found} but the CUDA runtime headers beside it are "
                f"{headers} (torch's runtime package), and CUDA's headers refuse another compiler: "
                + install_hint())
    return None


# The pip packages that make the compiler: nvcc's front end, the device compiler (cicc,
# nvvm) and the headers nvcc includes (crt) must be one release: a newer cicc writes PTX
# the older ptxas refuses ("Unsupported .version 9.5"). cuda-toolkit 13.0.2 (torch 2.11,
# 2.12) pins nvcc but leaves the other two to float to the newest.
_COMPILER_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt")


def pip_packages_apart(home: str) -> str | None:
    """Why the pip compiler in ``home`` is a mix of releases, or None."""
    root = pip_root()
    if root is None or Path(home).resolve() != root.resolve():
        return None
    found = {}
    for name in _COMPILER_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    if "nvidia-cuda-nvcc" not in found:
        return None
    want = ".".join(found["nvidia-cuda-nvcc"].split(".")[:2]) + "."  # the others follow nvcc
    fixes = " ".join(f'"{n}=={want}*"' for n, v in found.items() if not v.startswith(want))
    if not fixes:
        return None
    listed = ", ".join(f"{n} {v}" for n, v in found.items())
    return (f"the pip packages of the CUDA compiler in {home} are of different CUDA releases ({listed}), "
            f"whose parts refuse each other: pip install {fixes}")


def build_flags(home: str, build_dir: Path) -> tuple[list[str], list[str]]:
    """(include folders, linker flags) a pip root needs beyond torch's (the Note's two
    gaps); nothing for a full toolkit."""
    root = Path(home)
    if (root / "lib64").exists() or (root / "lib" / "libcudart.so").exists():
        return [], []
    includes = [str(p) for p in (root / "include", root / "include" / "cccl") if p.is_dir()]
    runtimes = sorted((root / "lib").glob("libcudart.so.*"))
    if not runtimes:
        return includes, []
    links = build_dir / "cuda_link"
    links.mkdir(parents=True, exist_ok=True)
    link = links / "libcudart.so"
    if not link.is_symlink() or os.readlink(link) != str(runtimes[0]):
        link.unlink(missing_ok=True)
        link.symlink_to(runtimes[0])
    return includes, [f"-L{links}"]
