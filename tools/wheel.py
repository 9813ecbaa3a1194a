"""The release wheel: tools/wheel.sh's Python half (Note [Prebuilt libraries] in
core_ops/native/loader.py says what the wheel holds and when it is used).

    python tools/wheel.py STAGING [--cpu-only] [--cuda-archs "8.0;...;12.0+PTX"]
    python tools/wheel.py STAGING --arch aarch64 --cross-torch DIR --cross-cudart FILE [...]

STAGING is a copy of the package's sources (wheel.sh makes it); the libraries are built
into STAGING/core_ops/lib with BUILD.json beside them, then the wheel is built from
STAGING and tagged py3-none-<platform>: the Python side is pure and the libraries call
torch only through its stable C ABI, so no CPython ABI tag applies. With --arch, the
libraries are for that machine, built by its cross compiler (aarch64-linux-gnu-g++)
against DIR (the torch package of that machine's wheel) and FILE (its libcudart).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# SASS for each (the wheel's users' GPUs: A100, A10/3090, L4/4090, H100/H200, B200,
# RTX 50xx) and PTX of the newest, which newer GPUs compile at load. On aarch64 (SBSA):
# GH200 (9.0), GB200 (10.0), Jetson Thor (11.0), DGX Spark's GB10 (12.1, which runs
# 12.0's SASS), and A100 / other Ampere parts in Arm servers (8.0).
CUDA_ARCHS = {"x86_64": "8.0;8.6;8.9;9.0;10.0;12.0+PTX", "aarch64": "8.0;9.0;10.0;11.0;12.0+PTX"}
CROSS_CXX = {"aarch64": "aarch64-linux-gnu-g++"}


def _sources_importable(staging: Path) -> None:
    sys.path.insert(0, str(staging))
    for name in [m for m in sys.modules if m == "core_ops" or m.startswith("core_ops.")]:
        del sys.modules[name]


def build_cpu(staging: Path, work: Path, cross=None) -> dict:
    from core_ops.native import build, toolchain
    machine = cross.machine if cross else build.machine()
    levels = list(build.levels_of(machine))
    ninja = toolchain.ninja()
    cxx = cross.cxx if cross else toolchain.cxx()
    if ninja is None or cxx is None:
        raise SystemExit("wheel.py: the wheel's build needs a C++ compiler and ninja (pip install ninja)")
    library = staging / "core_ops" / "lib" / "core_ops_cpu.so"
    library.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    build.cpu_library(library, work / "cpu", levels, cxx, ninja, jobs=toolchain.usable_cores(), cross=cross)
    print(f"wheel: CPU library, {machine} levels {', '.join(levels)}: {time.perf_counter() - start:.0f} s",
          flush=True)
    return {"file": library.name, "levels": levels, "machines": [machine]}


def build_cuda(staging: Path, work: Path, archs: str, cross=None, cudart: Path | None = None) -> dict:
    import torch
    from core_ops.native import build, toolchain
    if torch.version.cuda is None or toolchain.cuda_home() is None:
        raise SystemExit("wheel.py: the CUDA library needs a CUDA build of torch and a CUDA toolkit "
                         "(or pass --cpu-only)")
    start = time.perf_counter()
    build_dir = work / "cuda"
    build_dir.mkdir(parents=True, exist_ok=True)
    library = staging / "core_ops" / "lib" / "core_ops_cuda.so"
    if cross:
        build.cuda_library_cross(library, build_dir, archs, cross, cudart, toolchain.ninja(),
                                 jobs=toolchain.usable_cores())
    else:
        build.cuda_library("core_ops_cuda", build_dir, archs)
        shutil.copy2(build_dir / "core_ops_cuda.so", library)
    print(f"wheel: CUDA library, {archs}: {time.perf_counter() - start:.0f} s", flush=True)
    sass = [a.replace("+PTX", "").replace(".", "") for a in archs.split(";")]
    return {"file": library.name, "cuda_major": int(torch.version.cuda.split(".")[0]),
            "cuda": torch.version.cuda, "sass": sass,
            "ptx": [a.replace("+PTX", "").replace(".", "") for a in archs.split(";") if a.endswith("+PTX")],
            "machines": [cross.machine if cross else build.machine()]}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def retag(wheel: Path, platform_tag: str) -> Path:
    """py3-none-any -> py3-none-<platform_tag>, Root-Is-Purelib false (it holds libraries)."""
    out = wheel.with_name(wheel.name.replace("-py3-none-any.whl", f"-py3-none-{platform_tag}.whl"))
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        records = []
        for info in src.infolist():
            if info.filename == record_name:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/WHEEL"):
                text = data.decode().replace("Root-Is-Purelib: true", "Root-Is-Purelib: false")
                data = text.replace("Tag: py3-none-any", f"Tag: py3-none-{platform_tag}").encode()
            dst.writestr(info, data)
            records.append(_record_line(info.filename, data))
        dst.writestr(record_name, "\n".join(records + [f"{record_name},,"]) + "\n")
    wheel.unlink()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("staging", type=Path)
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--cuda-archs")
    parser.add_argument("--arch", help="the machine the libraries are for (default: this one)")
    parser.add_argument("--cross-torch", type=Path, help="with --arch: that machine's torch package folder")
    parser.add_argument("--cross-cudart", type=Path, help="with --arch: that machine's libcudart.so.<major>")
    args = parser.parse_args()
    staging = args.staging.resolve()
    _sources_importable(staging)
    import torch
    from core_ops.native import build, toolchain
    machine = args.arch or build.machine()
    cross = None
    if machine != build.machine():
        if machine not in CROSS_CXX or args.cross_torch is None:
            raise SystemExit(f"wheel.py: --arch {machine} needs --cross-torch (and one of: {', '.join(CROSS_CXX)})")
        cross = build.Cross(machine, CROSS_CXX[machine], args.cross_torch.resolve())
        if not args.cpu_only and args.cross_cudart is None:
            raise SystemExit("wheel.py: the cross-built CUDA library needs --cross-cudart (or pass --cpu-only)")
    work = Path(tempfile.mkdtemp(prefix="core_ops_wheel_"))
    libraries = {"cpu": build_cpu(staging, work, cross)}
    if not args.cpu_only:
        libraries["cuda"] = build_cuda(staging, work, args.cuda_archs or CUDA_ARCHS[machine], cross,
                                       args.cross_cudart)
    target = ".".join(map(str, toolchain.TARGET_TORCH))
    (staging / "core_ops" / "lib" / "BUILD.json").write_text(json.dumps(
        {"torch_target": target, "built_with_torch": torch.__version__.split("+")[0], "libraries": libraries},
        indent=1) + "\n")
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist), str(staging)], check=True)
    (wheel,) = dist.glob("core_ops-*.whl")
    wheel = retag(wheel, f"linux_{machine}")
    print(wheel)


if __name__ == "__main__":
    main()
