"""Building, caching and falling back (Note [Native build] in core_ops/native/cache.py).

These run real builds in fresh cache folders, in subprocesses, as a user would meet them.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torch

from core_ops.native import build, cache, cuda_toolkit, toolchain

PY = sys.executable
CALL = textwrap.dedent("""
    import warnings, torch, core_ops
    from core_ops import native
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        total, _ = core_ops.multi_tensor_l2norm([torch.full((16,), 1.0), torch.full((9,), 1.0)])
        core_ops.multi_tensor_l2norm([torch.ones(3)])
    print("RESULT", total.item())
    print("NATIVE", native.ensure("cpu").native)
    print("WARNINGS", len([w for w in caught if "core_ops" in str(w.message)]))
    for w in caught: print("WARNING", w.message)
""")


def run(code, cache, **env):
    # The JIT route on purpose: in a wheel install the wheel's own library would serve
    # first (Note [Prebuilt libraries]) and nothing here would be built or looked up.
    full = dict(os.environ, CORE_OPS_CACHE_DIR=str(cache), **{"CORE_OPS_BACKEND": "jit", **env})
    return subprocess.Popen([PY, "-c", code], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out, err


@pytest.mark.jit_build
def test_concurrent_ranks_build_once_then_load_from_cache(tmp_path):
    procs = [run(CALL, tmp_path) for _ in range(3)]
    results = [finish(p) for p in procs]
    builders = [err for _, err in results if "building native CPU kernels" in err]
    assert len(builders) == 1, [err for _, err in results]
    assert "built native CPU kernels in" in builders[0]
    for out, _ in results:
        assert "RESULT 5.0" in out and "NATIVE True" in out and "WARNINGS 0" in out
    out, err = finish(run(CALL, tmp_path))
    assert "building" not in err and "NATIVE True" in out
    assert len(list(tmp_path.glob("core_ops_cpu_*/core_ops_cpu_*.so"))) == 1


def test_no_compiler_falls_back_to_reference_with_one_warning(tmp_path):
    out, _ = finish(run(CALL, tmp_path, CXX="/nonexistent/c++"))
    assert "RESULT 5.0" in out and "NATIVE False" in out
    assert "WARNINGS 1" in out and "no C++ compiler found" in out


def with_broken_source(tmp_path):
    """CALL, building from a copy of the sources with one that does not compile."""
    broken = tmp_path / "csrc"
    shutil.copytree(build.CSRC, broken)
    (broken / "cpu" / "broken.cpp").write_text("this is not C++;\n")
    return (f"import core_ops.native.build as b\n"
            f"b.CSRC = __import__('pathlib').Path({str(broken)!r})\n" + CALL)


@pytest.mark.jit_build
def test_compile_error_falls_back_and_is_not_retried(tmp_path):
    code = with_broken_source(tmp_path)
    out, _ = finish(run(code, tmp_path / "cache"))
    assert "RESULT 5.0" in out and "NATIVE False" in out and "build failed" in out
    assert len(list((tmp_path / "cache").glob("*/FAILED"))) == 1
    out, err = finish(run(code, tmp_path / "cache"))
    assert "building" not in err and "an earlier build failed" in out


@pytest.mark.jit_build
def test_compile_error_warning_names_the_compilers_error(tmp_path):
    out, _ = finish(run(with_broken_source(tmp_path), tmp_path / "cache"))
    warning = next(line for line in out.splitlines() if "build failed" in line)
    assert "error" in warning and "broken.cpp" in warning and "-MMD" not in warning, warning


def cached_library_in(cache, built):
    """A copy of the JIT route's CPU library ``built`` in ``cache``, under its key."""
    shutil.copytree(built.parent, cache / built.parent.name, ignore=shutil.ignore_patterns("staging"))
    return cache / built.parent.name / built.name


@pytest.mark.jit_build  # without a compiler, that is the reason given first
def test_uncreatable_cache_falls_back_with_one_warning(tmp_path):
    (tmp_path / "a_file").write_text("")
    out, _ = finish(run(CALL, tmp_path / "a_file" / "cache"))
    assert "RESULT 5.0" in out and "NATIVE False" in out
    assert "WARNINGS 1" in out and "is not writable" in out and "CORE_OPS_CACHE_DIR" in out


def test_prebuilt_cache_loads_where_it_cannot_be_locked(tmp_path, jit_cpu_library):
    # A read-only cache (a container image prebuilt with `python -m core_ops build`):
    # the lock file cannot be opened, as here where a folder stands in its place.
    library = cached_library_in(tmp_path, jit_cpu_library)
    (tmp_path / f"{library.parent.name}.lock").mkdir()
    out, err = finish(run(CALL, tmp_path))
    assert "RESULT 5.0" in out and "NATIVE True" in out and "WARNINGS 0" in out
    assert "building" not in err


def test_cache_built_elsewhere_loads_without_a_compiler(tmp_path, jit_cpu_library):
    # A slim image with no compiler, running a cache built in a build stage: the key
    # with the compiler's version cannot be made here, the toolchain-free one can.
    cached_library_in(tmp_path, jit_cpu_library)
    out, err = finish(run(CALL, tmp_path))  # a machine with a compiler marks it on load
    assert "NATIVE True" in out and "building" not in err
    assert len(list(tmp_path.glob(f"*/{cache.PORTABLE_KEY}"))) == 1
    out, err = finish(run(CALL, tmp_path, CXX="/nonexistent/c++"))
    assert "RESULT 5.0" in out and "NATIVE True" in out and "WARNINGS 0" in out


def test_truncated_cached_library_is_not_loaded(tmp_path, jit_cpu_library):
    # Loading a library cut short (a build killed while linking) crashed with SIGBUS.
    library = cached_library_in(tmp_path, jit_cpu_library)
    assert cache.complete(library)
    with open(library, "r+b") as fh:
        fh.truncate(library.stat().st_size // 2)
    assert not cache.complete(library)
    code = ("from core_ops import native\n"
            "print('BACKEND', native.ensure('cpu', native.LOOK, warn=False).reason)")
    out, _ = finish(run(code, tmp_path))
    assert "BACKEND not built yet" in out


def test_pip_ninja_is_used_when_its_folder_is_not_on_path(monkeypatch, tmp_path):
    ninja = pytest.importorskip("ninja")
    monkeypatch.setenv("PATH", str(tmp_path))  # an environment's python run unactivated
    assert toolchain.missing("cpu") is None or "compiler" in toolchain.missing("cpu")
    with toolchain.ninja_on_path():
        assert os.environ["PATH"].split(os.pathsep)[0] == ninja.BIN_DIR
        assert shutil.which("ninja") is not None
    assert os.environ["PATH"] == str(tmp_path)  # the user's PATH is left as it was


def test_a_mistyped_backend_is_refused_not_ignored(tmp_path):
    """CORE_OPS_BACKEND=refernce ran the native kernels without a word: now `import
    core_ops` (and so `python -m core_ops info`) refuses it, naming the values there are
    (its setting's check, core_ops.settings), as the last line the user reads."""
    env = dict(os.environ, CORE_OPS_BACKEND="refernce", CORE_OPS_CACHE_DIR=str(tmp_path))
    code = "import torch, core_ops\ncore_ops.multi_tensor_l2norm([torch.ones(3)])"
    for command in ([PY, "-m", "core_ops", "info"], [PY, "-c", code]):
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        assert proc.returncode != 0
        assert proc.stderr.strip().splitlines()[-1].startswith(
            "core_ops.settings.BadEnvironment: CORE_OPS_BACKEND='refernce': expected one of auto, jit, reference"), \
            proc.stderr[-2000:]
    for value in ("auto", "Reference", ""):
        env = dict(os.environ, CORE_OPS_BACKEND=value)  # the suite's cache: nothing to build
        proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_forced_reference_backend(tmp_path):
    proc = subprocess.run([PY, "-m", "core_ops", "info"], capture_output=True, text=True,
                          env=dict(os.environ, CORE_OPS_BACKEND="reference", CORE_OPS_CACHE_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert "CORE_OPS_BACKEND=reference" in proc.stdout
    op_lines = [line for line in proc.stdout.splitlines() if line.strip().startswith("multi_tensor_")]
    assert op_lines and all(line.split()[-1] == "reference" for line in op_lines)
    assert not list(tmp_path.iterdir())  # nothing was built


def test_info_reports_native_cpu_ops():
    proc = subprocess.run([PY, "-m", "core_ops", "info"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cpu = proc.stdout.split("[cpu]")[1].split("[cuda]")[0]
    assert "native" in cpu.splitlines()[0]
    from core_ops._schemas import OP_NAMES
    ops = {line.split()[0]: line.split()[-1] for line in cpu.splitlines()[1:] if line.split()[:1] != ["passed"]
           and line.strip()}
    assert ops == {name: "native" for name in OP_NAMES}
    for key in ("torch", "cache", "c++ compiler", "cuda toolkit"):
        assert key in proc.stdout
    import core_ops
    assert proc.stdout.splitlines()[0].split() == ["core-ops:", core_ops.__version__]
    if not torch.cuda.is_available():  # nothing would build the CUDA kernels "on first use" here
        cuda = proc.stdout.split("[cuda]")[1].splitlines()[0]
        assert "no GPU here" in cuda and "first use" not in cuda


def test_cache_key_tracks_sources_flags_and_arch(tmp_path, monkeypatch):
    assert cache.key("cuda", "8.0") != cache.key("cuda", "9.0")
    before = cache.key("cpu")
    copy = tmp_path / "csrc"
    shutil.copytree(build.CSRC, copy)
    monkeypatch.setattr(build, "CSRC", copy)
    assert cache.key("cpu") == before
    header = copy / "include" / "core_ops" / "multi_tensor_math.h"
    header.write_text(header.read_text() + "\n// changed\n")
    assert cache.key("cpu") != before


def _why_no_cuda_build():
    """Why this machine cannot build the CUDA kernels for this torch, or None."""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA: there are no CUDA kernels to build"
    if toolchain.cxx() is None:
        return "no C++ compiler here: nvcc needs the host's (a wheel install runs its own libraries)"
    home = toolchain.cuda_home()
    if home is None or not Path(home, "bin", "nvcc").exists():
        return "no CUDA toolkit on this machine"
    return cuda_toolkit.mismatch(home)


NO_CUDA_BUILD = _why_no_cuda_build()
needs_cuda_build = pytest.mark.skipif(NO_CUDA_BUILD is not None, reason=str(NO_CUDA_BUILD))


@needs_cuda_build
def test_cuda_extension_compiles_for_sm80_and_sm90_and_loads():
    proc = subprocess.run([PY, "-m", "core_ops", "build", "--cuda", "--arch", "8.0;9.0"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    assert "cuda: ok: native" in proc.stdout


CUDA_ENTRY_CHECKS = textwrap.dedent("""
    import torch
    from core_ops import native
    from core_ops._schemas import op
    assert native.ensure("cpu").native and native.ensure("cuda").native  # the arch list of the build above
    CUDA = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)

    class ClaimsCuda(torch.Tensor):
        # Metadata only, dispatched as a CUDA tensor: reaching device code would raise
        # below, so every error seen comes from a check before it.
        @staticmethod
        def __new__(cls, shape, dtype=torch.float32, grad=False):
            return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="cuda", requires_grad=grad)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise AssertionError(f"{func} got past the checks")

    def raises(fn, text):
        try:
            fn()
        except ValueError as e:
            assert text in str(e), str(e)
            return
        raise AssertionError("no error: " + text)

    x, w6 = ClaimsCuda((4, 8), grad=True), ClaimsCuda((6,))
    fwd, bwd = op("layer_norm_fwd"), op("rms_norm_bwd")
    # the CUDA kernel itself (the autograd is Python's: Note [Norm autograd])
    raises(lambda: fwd.redispatch(CUDA, x, w6, None, 8, 1e-5, None, False), "weight has 6 elements")
    raises(lambda: bwd.redispatch(CUDA, x, x, ClaimsCuda((3,)), None, 8, False, torch.float32),
           "rstd must hold 4 torch.float32 values")
    raises(lambda: bwd.redispatch(CUDA, torch.ones(4, 8), x, ClaimsCuda((4,)), None, 8, False, torch.float32),
           "grad_out has 32 elements on cpu")
    # The fused optimizers' checks are written once (csrc/include/core_ops/optimizer_ops.h):
    # the CUDA kernel refuses a call in the CPU kernel's words.
    def adam_args(T):  # no exp_avgs
        return [T(4)], [T(4)], [], [T(4)], [], [], [T(1)], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, False, False, None, None, None
    adam, cuda = op("fused_adam_"), lambda *shape: ClaimsCuda(shape)
    raises(lambda: adam(*adam_args(torch.zeros)), "exp_avgs has 0 tensors but params has 1")
    raises(lambda: adam.redispatch(CUDA, *adam_args(cuda)), "exp_avgs has 0 tensors but params has 1")
    raises(lambda: op("fused_sgd_").redispatch(CUDA, [cuda(4)], [cuda(4)], [], [], 0.1, 0.0, 0.0, 0.0, True, False,
                                               False, False, None, None, None), "nesterov needs momentum > 0")
    raises(lambda: op("fused_lamb_stage2_").redispatch(CUDA, [cuda(4)], [], [cuda(4)], cuda(2), cuda(1), 1e-3, 0.0, False,
                                                       None, None), "param_norms and update_norms must hold one")
    print("CHECKED")
""")


@needs_cuda_build
def test_cuda_library_checks_bad_input_before_device_code():
    """Note [Norm checks before dispatch]: the CUDA library's norm entry points (its C++
    autograd and its kernels), and its fused optimizers', reject bad input before any
    device code, exercised with no GPU through a tensor that only claims to be on CUDA.
    On the H200, a bad weight reached the CUDA path and the process died. Loads the
    library the test above built (the default arch list; on a GPU machine, its own arch,
    which tests/gpu/run.sh built)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}  # an earlier build's
    proc = subprocess.run([PY, "-c", CUDA_ENTRY_CHECKS], capture_output=True, text=True, timeout=1800, env=env)
    assert proc.returncode == 0 and "CHECKED" in proc.stdout, proc.stdout + proc.stderr[-5000:]


HIDE_THE_TOOLKIT_AND_BUILD = """
set -e
for target in "$@"; do
  if [ -d "$target" ]; then mount --bind "$EMPTY_DIR" "$target"; else mount --bind "$EMPTY_FILE" "$target"; fi
done
unset CUDA_HOME CUDA_PATH
"$PY" -m core_ops build --cuda --arch 9.0
"$PY" -m core_ops info
"""
NVCC_TOOLS = ("nvcc", "ptxas", "cudafe++", "fatbinary", "nvlink", "bin2c", "__nvcc_device_query")


def _system_toolkit(pip):
    """What a private mount namespace hides so that only the pip root is left: the
    toolkit folders and every CUDA tool (or wrapper) on PATH outside the pip root."""
    hide = set()
    for root in (cuda_toolkit.find_root(), "/usr/local/cuda"):
        if root and Path(root).exists() and Path(root).resolve() != pip.resolve():
            hide.add(str(Path(root).resolve()))
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for name in NVCC_TOOLS:
            tool = Path(folder, name)
            if tool.is_file() and pip.resolve() not in tool.resolve().parents:
                hide.add(str(tool))
    return sorted(hide)


@pytest.mark.skipif(cuda_toolkit.pip_root() is None or shutil.which("unshare") is None
                    or not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs the [cuda] extra's pip packages, unshare and root")
@pytest.mark.skipif(cuda_toolkit.pip_root() is not None
                    and cuda_toolkit.pip_packages_apart(str(cuda_toolkit.pip_root())) is not None,
                    reason="the [cuda] extra's packages are of different releases (the build refuses them: "
                           "test_compiler_packages_of_two_releases_are_named)")
def test_the_cuda_kernels_build_from_pip_packages_alone(tmp_path):
    """Note [CUDA toolkit from pip]: with the system toolkit and every nvcc wrapper
    hidden (a private mount namespace: hiding nvcc from PATH alone is not enough,
    cpp_extension also looks in /usr/local/cuda) and CUDA_HOME unset, the CUDA library
    builds for sm_90 from the pip packages in a fresh cache, loads, and `info` names
    the pip root as the toolkit."""
    pip = cuda_toolkit.pip_root()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty_file").write_text("")
    env = dict(os.environ, PY=PY, EMPTY_DIR=str(tmp_path / "empty"), EMPTY_FILE=str(tmp_path / "empty_file"),
               CORE_OPS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(["unshare", "-m", "bash", "-c", HIDE_THE_TOOLKIT_AND_BUILD, "hide",
                           *_system_toolkit(pip)], capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "cuda: ok: native" in proc.stdout
    assert f"cuda toolkit: {pip}" in proc.stdout


def test_compiler_packages_of_two_releases_are_named(monkeypatch):
    """cuda-toolkit 13.0.2 (torch 2.11, 2.12) pins nvcc but not nvvm and crt, so pip took
    13.5's beside nvcc 13.0, whose ptxas refused the PTX: the build says which packages
    to pin instead of failing in ptxas."""
    pip = cuda_toolkit.pip_root()
    if pip is None:
        pytest.skip("needs the [cuda] extra's pip packages")
    real = cuda_toolkit.version
    monkeypatch.setattr(cuda_toolkit, "version", lambda name: {"nvidia-cuda-nvcc": "13.0.88", "nvidia-nvvm": "13.5.37",
                                                                "nvidia-cuda-crt": "13.5.37"}.get(name) or real(name))
    reason = cuda_toolkit.mismatch(str(pip))
    assert reason == (f"the pip packages of the CUDA compiler in {pip} are of different CUDA releases "
                      "(nvidia-cuda-nvcc 13.0.88, nvidia-nvvm 13.5.37, nvidia-cuda-crt 13.5.37), whose parts "
                      'refuse each other: pip install "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*"')
    monkeypatch.setattr(cuda_toolkit, "version", lambda name: "13.0.88")
    assert cuda_toolkit.pip_packages_apart(str(pip)) is None
    assert cuda_toolkit.pip_packages_apart("/usr/local/cuda") is None  # a full toolkit: not pip's


def test_a_compiler_of_another_cuda_release_is_named(tmp_path, monkeypatch):
    """A toolkit whose CUDA major version is not torch's, or whose runtime headers are
    another release than its compiler (the pip packages of two releases in one root),
    gets a reason that says so and what to install, not a compile error."""
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"

    def compiler(release):
        nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
        nvcc.chmod(0o755)

    compiler("11.8")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    message = cuda_toolkit.mismatch(str(tmp_path))
    assert "is CUDA 11.8 but this torch was built with CUDA 13.0" in message
    assert 'pip install "cuda-toolkit[nvcc,cccl]==13.0.*"' in message
    compiler("13.2")
    assert cuda_toolkit.mismatch(str(tmp_path)) is None  # a minor version apart builds
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13020\n")
    assert cuda_toolkit.mismatch(str(tmp_path)) is None  # its own headers
    compiler("13.0")
    monkeypatch.setattr(torch.version, "cuda", "13.2")
    message = cuda_toolkit.mismatch(str(tmp_path))
    assert "is CUDA 13.0 but the CUDA runtime headers beside it are 13.2" in message
    assert 'pip install "cuda-toolkit[nvcc,cccl]==13.2.*"' in message
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(toolchain, "cxx", lambda: "/usr/bin/c++")  # a host compiler is checked first
    message = toolchain.missing("cuda")
    assert "is CUDA 13.0 but this torch was built with CUDA 12.4" in message
    assert "set CUDA_HOME to a CUDA 12.x toolkit (12.4 as torch)" in message


def test_each_cpu_source_compiles_once_per_level_baseline_linked_first():
    """Note [CPU levels]: the ninja file compiles register.cpp once and every other
    source once per level with that level's flags, and links the baseline objects
    first (the linker keeps the first copy of a shared inline function)."""
    text = build._ninja_file("c++", ["avx512", "baseline", "avx2"], "lib.so")
    builds = [line.split()[1].rstrip(":") for line in text.splitlines() if line.startswith("build ") and ".o:" in line]
    names = [p.stem for p in build.kernel_sources()]
    assert builds == ["register.o"] + [f"{level}/{n}.o" for level in ("baseline", "avx2", "avx512") for n in names]
    link = next(line for line in text.splitlines() if line.startswith("build lib.so: link"))
    assert link.split()[3:] == builds
    assert "-DCORE_OPS_CPU_LEVEL=avx512 -DCORE_OPS_CPU_LEVEL_ID=2" in text and "-mavx512bw" in text
    assert toolchain.TARGET_FLAG == "-DTORCH_TARGET_VERSION=0x020a000000000000"


def test_a_cross_build_compiles_the_other_machines_levels_against_its_torch(tmp_path):
    """build.Cross: the ninja file of the aarch64 library names aarch64's one level
    (neon), the cross compiler, and the aarch64 torch's headers and libtorch_cpu, not
    this machine's."""
    cross = build.Cross("aarch64", "aarch64-linux-gnu-g++", tmp_path / "torch")
    text = build._ninja_file(cross.cxx, ["neon"], "lib.so", cross)
    builds = [line.split()[1].rstrip(":") for line in text.splitlines() if line.startswith("build ") and ".o:" in line]
    assert builds == ["register.o"] + [f"neon/{p.stem}.o" for p in build.kernel_sources()]
    assert "cxx = aarch64-linux-gnu-g++" in text
    assert "-DCORE_OPS_CPU_LEVEL=neon -DCORE_OPS_CPU_LEVEL_ID=0" in text and "-mavx" not in text
    assert f"-I{tmp_path / 'torch' / 'include'}" in text and f"-L{tmp_path / 'torch' / 'lib'}" in text
    assert str(Path(torch.__file__).parent) not in text
    with pytest.raises(ValueError, match="levels must be some of neon on aarch64"):
        build.cpu_library(tmp_path / "lib.so", tmp_path, ["avx2"], cross.cxx, "ninja", cross=cross)


def test_gencode_flags_give_sass_for_each_arch_and_ptx_where_marked():
    assert build.gencode_flags("8.0;11.0;12.0+PTX") == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_110,code=sm_110",
        "-gencode=arch=compute_120,code=sm_120", "-gencode=arch=compute_120,code=compute_120"]


def test_kernels_include_nothing_of_torch_but_its_stable_abi():
    """Note [Stable ABI]: no ATen, c10 or torch C++ API header outside torch/csrc/stable
    and torch/headeronly, so the libraries load on every torch from the target on."""
    allowed = ("torch/csrc/stable/", "torch/headeronly/")
    offenders = []
    for path in sorted(build.CSRC.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            included = re.match(r'\s*#\s*include\s*[<"]([^>"]+)[>"]', line)
            if included and included.group(1).split("/")[0] in ("ATen", "c10", "torch") \
                    and not included.group(1).startswith(allowed):
                offenders.append(f"{path.relative_to(build.CSRC)}:{n}: {included.group(1)}")
    assert not offenders, offenders


def test_kernels_read_dtypes_through_dtype_of():
    """Note [Dtype lookup]: Tensor::scalar_type() costs up to 22 calls into torch; the
    kernels read a dtype with core_ops::dtype_of (one call), which alone may call it."""
    offenders = []
    for path in sorted(build.CSRC.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if re.search(r"(\.|->)scalar_type\(\)", code) and "return t.scalar_type();" not in code:
                offenders.append(f"{path.relative_to(build.CSRC)}:{n}: {line.strip()}")
    assert not offenders, offenders
