"""Note [Prebuilt libraries]: when the wheel's own library is taken, when it is passed
over for the JIT cache, and what `core_ops info` then says; and the wheel's tag."""

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from core_ops.native import loader

REPO = Path(__file__).resolve().parents[1]


def _manifest(folder, **changes):
    entry = {"file": "core_ops_cpu.so", "levels": ["baseline"], "machines": ["x86_64", "aarch64"]}
    entry.update(changes.pop("cpu", {}))
    built = {"torch_target": "2.10", "built_with_torch": "2.14.1", "libraries": {"cpu": entry}}
    built.update(changes)
    (folder / "BUILD.json").write_text(json.dumps(built))
    (folder / "core_ops_cpu.so").write_bytes(b"\x7fELF")


@pytest.fixture
def lib_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "LIB_DIR", tmp_path)
    monkeypatch.setattr(loader, "MANIFEST", tmp_path / "BUILD.json")
    return tmp_path


def test_a_source_install_has_no_wheel_library(lib_dir):
    path, why = loader.wheel_library("cpu")
    assert path is None and "source install builds at first use" in why


def test_the_wheel_library_is_taken_from_its_target_release_on(lib_dir):
    _manifest(lib_dir)
    path, why = loader.wheel_library("cpu")
    assert path == lib_dir / "core_ops_cpu.so"
    assert "the wheel's" in why and "for torch >= 2.10" in why


def test_an_older_torch_than_the_target_takes_the_jit_route(lib_dir):
    _manifest(lib_dir, torch_target="9.1")
    path, why = loader.wheel_library("cpu")
    assert path is None and f"torch {torch.__version__} is older than the wheel's libraries (torch >= 9.1)" in why


def test_a_library_for_another_machine_or_missing_is_not_taken(lib_dir):
    _manifest(lib_dir, cpu={"machines": ["riscv64"]})
    path, why = loader.wheel_library("cpu")
    assert path is None and "is for riscv64" in why
    _manifest(lib_dir)
    (lib_dir / "core_ops_cpu.so").unlink()
    path, why = loader.wheel_library("cpu")
    assert path is None and "missing from the install" in why


def test_the_cuda_library_needs_torchs_cuda_major(lib_dir, monkeypatch):
    _manifest(lib_dir)
    path, why = loader.wheel_library("cuda")
    assert path is None and "has no CUDA library (a --cpu-only wheel)" in why
    built = json.loads((lib_dir / "BUILD.json").read_text())
    built["libraries"]["cuda"] = {"file": "core_ops_cuda.so", "cuda_major": 13, "sass": ["90"],
                                  "machines": ["x86_64", "aarch64"]}
    (lib_dir / "BUILD.json").write_text(json.dumps(built))
    (lib_dir / "core_ops_cuda.so").write_bytes(b"\x7fELF")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    path, why = loader.wheel_library("cuda")
    assert path is None and "torch's CUDA is 12.8, the wheel's library is for CUDA 13" in why
    monkeypatch.setattr(torch.version, "cuda", None)
    assert loader.wheel_library("cuda") == (None, "this torch has no CUDA")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    path, why = loader.wheel_library("cuda")
    assert path == lib_dir / "core_ops_cuda.so" and "SASS for sm_90" in why


# The loading order with a real library: the CPU library this session built, presented
# as a wheel's in a fresh process (one process loads one CPU library).
_ORDER = textwrap.dedent("""
    import json, shutil, sys
    from pathlib import Path
    import core_ops
    from core_ops import native
    from core_ops.native import loader
    lib, target = Path(sys.argv[1]), sys.argv[2]
    loader.LIB_DIR, loader.MANIFEST = lib, lib / "BUILD.json"
    built = json.loads(loader.MANIFEST.read_text())
    built["torch_target"] = target
    loader.MANIFEST.write_text(json.dumps(built))
    backend = native.ensure("cpu", warn=False)
    print(backend.native, backend.path)
    print(backend.reason)
    print(" | ".join(backend.passed_over))
""")


@pytest.fixture(scope="module")
def built_cpu(jit_cpu_library):
    return jit_cpu_library  # the JIT cache's: the one taken when the wheel's is passed over


def _order(tmp_path, built_cpu, target, **env):
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    _manifest(lib)  # then the real library in place of its placeholder
    shutil.copy2(built_cpu, lib / "core_ops_cpu.so")
    proc = subprocess.run([sys.executable, "-c", _ORDER, str(lib), target], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    native_path, reason, passed = proc.stdout.splitlines()[-3:]  # the last may be empty
    return native_path, reason, passed


def test_loading_order_wheel_first_then_the_jit_cache(tmp_path, built_cpu):
    where, reason, passed = _order(tmp_path, built_cpu, "2.10")
    assert where == f"True {tmp_path / 'lib' / 'core_ops_cpu.so'}"
    assert reason.startswith("native: the wheel's") and "; level " in reason and passed == ""
    # the wheel's library is too new for this torch: the JIT cache, saying why
    where, reason, passed = _order(tmp_path, built_cpu, "9.1")
    assert where == f"True {built_cpu}"
    assert reason.startswith("native: built here") and passed.startswith("1 wheel: torch ")
    # CORE_OPS_BACKEND=jit passes over it on purpose
    where, reason, passed = _order(tmp_path, built_cpu, "2.10", CORE_OPS_BACKEND="jit")
    assert where == f"True {built_cpu}" and passed == "1 wheel: CORE_OPS_BACKEND=jit"


def test_retag_makes_a_py3_none_platform_wheel_with_a_true_record(tmp_path):
    spec = importlib.util.spec_from_file_location("wheel_tool", REPO / "tools" / "wheel.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    pure = tmp_path / "core_ops-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(pure, "w") as z:
        z.writestr("core_ops/lib/core_ops_cpu.so", b"\x7fELF library")
        z.writestr("core_ops-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("core_ops-0.1.0.dist-info/RECORD", "stale\n")
    tagged = tool.retag(pure, "linux_x86_64")
    assert tagged.name == "core_ops-0.1.0-py3-none-linux_x86_64.whl" and not pure.exists()
    with zipfile.ZipFile(tagged) as z:
        wheel = z.read("core_ops-0.1.0.dist-info/WHEEL").decode()
        assert "Tag: py3-none-linux_x86_64" in wheel and "Root-Is-Purelib: false" in wheel
        records = dict(line.split(",", 1) for line in z.read("core_ops-0.1.0.dist-info/RECORD").decode().splitlines())
        for name in ("core_ops/lib/core_ops_cpu.so", "core_ops-0.1.0.dist-info/WHEEL"):
            data = z.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert records[name] == f"sha256={digest},{len(data)}"
        assert records["core_ops-0.1.0.dist-info/RECORD"] == ","
