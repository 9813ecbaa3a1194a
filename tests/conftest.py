"""Devices, dtype ids, the one tolerance table of the test suite, and the one-rank
process group of the tests that need a group but not a second rank."""

import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import core_ops  # noqa: F401  (registers the ops)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
REDUCED = [torch.float16, torch.bfloat16]
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


# Note [Test tolerances]: elementwise results differ from the reference by at most
# one rounding of the output dtype (the reference runs torch's own kernels, which may
# fuse a*x + b*y into one FMA; ours, built with -ffp-contract=off and -fmad=false,
# round twice), so rtol is one ulp of the output dtype and atol
# covers results near zero. Norms are sums of up to ~1e6 squares accumulated in float32
# in a different order (vector lanes, chunks) than torch, so 1e-5 relative.
ELEMENTWISE_TOL = {
    torch.float64: dict(rtol=1e-15, atol=1e-15),
    torch.float32: dict(rtol=1.2e-7, atol=1e-7),
    torch.float16: dict(rtol=9.8e-4, atol=1e-5),
    torch.bfloat16: dict(rtol=7.9e-3, atol=1e-5),
}
NORM_TOL = {
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=1e-5, atol=1e-6),
}


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def world1():
    """A gloo group of one rank in the test's own process, created and destroyed per test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=10))
    yield
    dist.destroy_process_group()


@pytest.fixture
def both_native():
    """GPU tests that compare the native CPU and CUDA kernels: both must have built."""
    from core_ops import native
    for kind in ("cpu", "cuda"):
        backend = native.ensure(kind)
        assert backend.native, backend.reason


def _has_cxx():
    """Whether inductor can compile its CPU code here (it needs a C++ compiler, as the
    JIT route of core_ops does; a wheel install on a slim machine has none)."""
    import shutil
    return shutil.which(os.environ.get("CXX") or "g++") is not None


NO_JIT_BUILD = "the JIT route builds with a C++ compiler, and none is here (a wheel install runs its own libraries)"


def pytest_collection_modifyitems(config, items):
    from core_ops.native import toolchain
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_cxx = pytest.mark.skip(reason="inductor's CPU code needs a C++ compiler, and none is here")
    no_jit = pytest.mark.skip(reason=NO_JIT_BUILD)
    cuda, cxx, jit = torch.cuda.is_available(), _has_cxx(), toolchain.cxx() is not None
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(no_gpu)
        on_cpu = getattr(item, "callspec", None) is None or item.callspec.params.get("device", "cpu") == "cpu"
        if "inductor_cpu" in item.keywords and on_cpu and not cxx:
            item.add_marker(no_cxx)
        if "jit_build" in item.keywords and not jit:
            item.add_marker(no_jit)


@pytest.fixture(scope="session")
def jit_cpu_library():
    """The JIT route's CPU library (built into the suite's cache if need be), for the
    tests of building, caching and cache trust: in a wheel install this process runs
    the wheel's library instead (Note [Prebuilt libraries]). Skips without a compiler."""
    from core_ops import native
    from core_ops.native import loader, toolchain
    if toolchain.cxx() is None:
        pytest.skip(NO_JIT_BUILD)
    backend = native.ensure("cpu")
    if backend.native and Path(backend.path).parent != loader.LIB_DIR:
        return Path(backend.path)
    code = "from core_ops import native; b = native.ensure('cpu', warn=False); print(b.native, b.path)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "CORE_OPS_BACKEND": "jit"})
    assert proc.returncode == 0 and proc.stdout.split()[-2] == "True", proc.stdout + proc.stderr[-3000:]
    return Path(proc.stdout.split()[-1])


def assert_axpby_close(out, x, y, a, b):
    """``out`` equals a*x + b*y to within the rounding of the output dtype plus float32
    rounding of each product: a kernel may fuse into one FMA, so under cancellation
    the error is relative to |a*x| + |b*y|, not to the (small) result."""
    xd, yd = x.double(), y.double()
    exact = a * xd + b * yd
    magnitude = (a * xd).abs() + (b * yd).abs()
    bound = torch.finfo(out.dtype).eps * exact.abs() + 2 * torch.finfo(torch.float32).eps * magnitude
    err = (out.double() - exact).abs()
    assert bool((err <= bound + 1e-30).all()), f"max excess {(err - bound).max().item():.3g}"
