"""Finding a compiler, building, caching and loading the native kernels.

Note [Native build]: nothing is compiled at install time. The first op called on a
device type builds that device's library from ``csrc/`` with ninja, through
``torch.utils.cpp_extension``, into a cache folder keyed by everything that changes
the binary (torch and CUDA versions, compiler, flags, CUDA arch list, source hash).
A file lock makes ranks that start together build once while the others wait; later
processes only load the cached library. A library is linked in a staging folder and
moved into place whole, and one cut short is never loaded; a cache that cannot be
written (a read-only image prebuilt with ``python -m core_ops build``) is still read,
and so is one built elsewhere where no compiler or CUDA toolkit is installed (found by
a key without the toolchain, ``PORTABLE_KEY`` beside each library).
Any failure (no compiler, no nvcc, a compile error, no writable cache) leaves the
package working on the pure-PyTorch reference kernels, with one warning that names
the cause; ``python -m core_ops info`` shows it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from . import _cache_trust, _cpu_build, _cuda_toolkit, _wheel_library, settings

CSRC = Path(__file__).resolve().parent / "csrc"
KINDS = ("cpu", "cuda")
DEFAULT_CUDA_ARCHS = "8.0;9.0"


@dataclasses.dataclass
class Backend:
    native: bool
    reason: str
    path: str | None = None


_backends: dict[str, Backend] = {}


def forced_reference() -> bool:
    """Whether CORE_OPS_BACKEND asks for the pure-PyTorch reference everywhere (a value
    outside the setting's is refused by it: a typo must not run native kernels
    without a word)."""
    return settings.core("backend") == "reference"


def _default_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "core_ops"


def cache_root() -> Path:
    """The cache the settings name (CORE_OPS_CACHE_DIR, else the user's cache folder)."""
    folder = settings.core("cache_dir")
    return Path(folder).expanduser() if folder else _default_root()


def cache() -> tuple[Path, str | None]:
    """(the cache used, why ``cache_root()`` was passed over or None): Note [A cache no
    one else writes] in _cache_trust.py."""
    return _cache_trust.choose(cache_root(), _default_root())


def sources(kind: str) -> list[Path]:
    """The CPU library's .cpp files; the CUDA library's .cu files and the .cpp files of
    its host-only code (compiled by the host compiler: nvcc is slower at it)."""
    folder = CSRC / kind
    if kind == "cpu":
        return sorted(folder.glob("*.cpp"))
    return sorted(folder.glob("*.cu")) + sorted(folder.glob("*.cpp"))


def _usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _hashed_files(kind: str) -> list[Path]:
    headers = sorted((CSRC / "include").rglob("*.h")) + sorted((CSRC / kind).glob("*.h"))
    headers += sorted((CSRC / kind).glob("*.cuh"))
    return sources(kind) + headers


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if "nvcc" in cmd[0] else (lines[0] if lines else "")


def cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++"))


def cuda_home() -> str | None:
    """The CUDA toolkit root (Note [CUDA toolkit from pip] in _cuda_toolkit.py)."""
    return _cuda_toolkit.find_root()


def cuda_archs(arch: str | None = None) -> str:
    if arch:
        return arch
    for var in ("CORE_OPS_CUDA_ARCH", "TORCH_CUDA_ARCH_LIST"):
        if os.environ.get(var):
            return os.environ[var]
    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))
    return DEFAULT_CUDA_ARCHS


def cuda_flags() -> list[str]:
    # No --use_fast_math: the non-finite probe needs IEEE inf/nan (Note [Non-finite probe]).
    # -fmad=false: as -ffp-contract=off on the CPU (_cpu_build.common_flags), each * and + rounds once,
    # so a CUDA kernel rounds exactly as the CPU kernel running the same math header
    # does, and the two agree bit for bit; nvcc's default contraction into FMAs moved
    # results by an ulp a step, differently per op. Division and sqrt stay IEEE
    # (-prec-div / -prec-sqrt default to true). The kernels are bound by memory.
    # Hidden visibility: as the CPU library's (_cpu_build.common_flags), nothing exported.
    return ["-O3", "--expt-relaxed-constexpr", "-lineinfo", "-fmad=false", "-Xcompiler=-fvisibility=hidden",
            _cpu_build.TARGET_FLAG]


def build_key(kind: str, arch: str | None = None, toolchain: bool = True) -> str:
    """The cache key of ``kind``'s library. ``toolchain=False`` leaves out the compiler
    and the CUDA toolkit: the key a prebuilt library is found by where none is
    installed (a slim image run from a cache built elsewhere, Note [Native build])."""
    h = hashlib.sha256()
    parts = [torch.__version__, str(torch.version.cuda)]
    if toolchain:
        parts.append(_first_line([cxx() or "c++", "--version"]))
    if kind == "cpu":
        parts += _cpu_build.hashed_parts([_cpu_build.host_level()])
    else:
        parts += cuda_flags() + [cuda_archs(arch)]
        if toolchain:
            home = cuda_home() or ""
            parts += [home, _first_line([os.path.join(home, "bin", "nvcc"), "--version"])]
    h.update("\0".join(parts).encode())
    for f in _hashed_files(kind):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


PORTABLE_KEY = "PORTABLE_KEY"  # beside a library: its build_key(toolchain=False)


def _mark_portable(kind: str, build_dir: Path, arch: str | None) -> None:
    with contextlib.suppress(OSError):
        marker = build_dir / PORTABLE_KEY
        key = build_key(kind, arch, toolchain=False)
        if not marker.is_file() or marker.read_text() != key:
            marker.write_text(key)


def _prebuilt(kind: str, arch: str | None) -> Path | None:
    """A complete library in the cache built from these sources, flags and torch by
    any toolchain, for a machine that has none."""
    try:
        key = build_key(kind, arch, toolchain=False)
        root, _ = cache()
        for folder in sorted(root.glob(f"core_ops_{kind}_*")):
            marker, library = folder / PORTABLE_KEY, folder / f"{folder.name}.so"
            if (marker.is_file() and marker.read_text() == key and _complete(library)
                    and _cache_trust.why_unsafe(root, library) is None):
                return library
    except OSError:
        pass
    return None


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock across processes (ranks of one job); no-op where fcntl is absent."""
    _cache_trust.make_private(path.parent)
    with open(path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: builds are not shared between ranks there
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _library_name(kind: str, key: str) -> str:
    return f"core_ops_{kind}_{key}"


def _compile(kind: str, name: str, build_dir: Path, arch: str | None) -> None:
    if kind == "cpu":
        _cpu_build.build(build_dir / f"{name}.so", build_dir, [_cpu_build.host_level()], cxx(), ninja(),
                         jobs=_usable_cores(), verbose=settings.core("verbose_build") == "1")
        return
    home = cuda_home()
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
    os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_archs(arch)
    # torch's wheels keep the headers of their CUDA libraries (cuDNN, NCCL, ...) in
    # site-packages/nvidia/*/include; the runtime's (nvidia/cu13) only when it is the
    # toolkit too: beside another toolkit they are a second CUDA release's headers,
    # which CCCL refuses (a 13.0 nvcc with torch 2.15's 13.2 runtime).
    runtime = _cuda_toolkit.pip_runtime()
    includes = [str(CSRC / "include")]
    includes += [str(p) for p in _cuda_toolkit.site_nvidia().glob("*/include")
                 if p.parent != runtime or Path(home).resolve() == runtime.resolve()]
    pip_includes, link_flags = _cuda_toolkit.build_flags(home, build_dir)
    includes += [p for p in pip_includes if p not in includes]
    with _ninja_on_path():
        cpp_extension.load(
            name=name,
            sources=[str(s) for s in sources(kind)],
            extra_include_paths=includes,
            build_directory=str(build_dir),
            is_python_module=False,
            with_cuda=True,
            verbose=settings.core("verbose_build") == "1",
            extra_cflags=["-O3", "-fvisibility=hidden", _cpu_build.TARGET_FLAG],
            extra_cuda_cflags=cuda_flags(),
            extra_ldflags=link_flags,
        )


def _cause(error: Exception) -> str:
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


def _complete(library: Path) -> bool:
    """Whether ``library`` is a whole ELF shared object: a file cut short (a build
    killed while linking, a full disk) would crash the process with SIGBUS when
    loaded. The section headers end the file, so a cut file lacks some of them."""
    try:
        with open(library, "rb") as fh:
            head = fh.read(64)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return False
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return sys.platform != "linux" and len(head) > 0  # other formats: not checked
    if head[4] != 2:  # 32-bit ELF: torch has no such builds
        return False
    order = "little" if head[5] == 1 else "big"
    shoff = int.from_bytes(head[0x28:0x30], order)
    shentsize = int.from_bytes(head[0x3A:0x3C], order)
    shnum = int.from_bytes(head[0x3C:0x3E], order)
    return shoff + shentsize * shnum <= size


def _unavailable(kind: str, reason: str, warn: bool) -> Backend:
    backend = Backend(False, reason)
    _backends[kind] = backend
    if warn:
        warnings.warn(f"core_ops: native {kind.upper()} kernels unavailable ({reason}); "
                      "every op runs on the pure-PyTorch reference", RuntimeWarning, stacklevel=4)
    return backend


def _precondition(kind: str) -> str | None:
    """Why a native library for ``kind`` cannot be built here, or None."""
    if _cpu_build.release(torch.__version__) < _cpu_build.TARGET_TORCH:
        return (f"torch {torch.__version__} is older than the kernels' stable ABI target "
                f"({'.'.join(map(str, _cpu_build.TARGET_TORCH))}); pip install 'torch>=2.10'")
    if cxx() is None:  # nvcc needs the host compiler too
        return "no C++ compiler found (set CXX or install g++)"
    if kind == "cuda":
        if torch.version.cuda is None:
            return "this PyTorch build has no CUDA"
        home = cuda_home()
        if home is None:
            return ("no CUDA toolkit found (no nvcc on PATH, CUDA_HOME unset, no pip-installed compiler): "
                    + _cuda_toolkit.install_hint())
        problem = _cuda_toolkit.mismatch(home)
        if problem:
            return problem
    if not shutil.which("ninja") and not _pip_ninja_folder():
        return "ninja not found (pip install ninja)"
    return None


def _pip_ninja_folder() -> str | None:
    """The folder of the ninja the pip package (a dependency) installs into the
    environment's bin folder. torch's cpp_extension runs the ``ninja`` on PATH, and
    that folder is not on PATH when the environment's python runs unactivated
    (``.venv/bin/python``), so ``_compile`` puts it there for the build."""
    try:
        import ninja
    except ImportError:
        return None
    folder = getattr(ninja, "BIN_DIR", None)
    return folder if folder and shutil.which("ninja", path=folder) else None


def ninja() -> str | None:
    """The ninja to run: the one on PATH, else the pip package's."""
    return shutil.which("ninja") or shutil.which("ninja", path=_pip_ninja_folder() or "")


@contextlib.contextmanager
def _ninja_on_path():
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


def ensure(kind: str, *, build: bool = True, force: bool = False, arch: str | None = None,
           warn: bool = True, retry_failed: bool = False) -> Backend:
    """Load (building if needed and ``build``) the native library for ``kind``.

    Cheap after the first call: the outcome is remembered for the process.
    """
    if kind in _backends and not force:
        return _backends[kind]
    if forced_reference():
        return _unavailable(kind, "CORE_OPS_BACKEND=reference", warn=False)
    # Tier 1, the wheel's own library (Note [Prebuilt libraries]); a build asked for
    # (force, an arch) or CORE_OPS_BACKEND=jit goes to the JIT cache.
    wheel, why = _wheel_library.library(kind)
    if wheel is not None and (force or arch or forced_jit()):
        wheel, why = None, (_jit_reason() if forced_jit() else "a build was asked for")
    if wheel is not None:
        backend = _load(kind, wheel, warn, f"native: {why}")
        if backend.native:
            return backend
        why = backend.reason
    _wheel_not_taken[kind] = why
    problem = _precondition(kind)
    if problem:
        prebuilt = None if force else _prebuilt(kind, arch)
        return _load(kind, prebuilt, warn) if prebuilt else _unavailable(kind, problem, warn)
    try:
        key = build_key(kind, arch)
    except OSError as e:
        return _unavailable(kind, f"cannot read kernel sources: {e}", warn)
    root, _ = cache()
    name = _library_name(kind, key)
    # A folder or library in it that someone else could have written is not loaded: it
    # is built again privately (Note [A cache no one else writes]).
    root, _ = _cache_trust.choose(root, _default_root(), root / name / f"{name}.so")
    build_dir = root / name
    library = build_dir / f"{name}.so"
    if not build and not force:  # a look, not a build: the cache is read, never written
        if _complete(library) and not (build_dir / "FAILED").exists():
            return _load(kind, library, warn)
        return _unavailable(kind, "not built yet: it builds on first use, or run `python -m core_ops build`",
                            warn=False)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_file_lock(root / f"{name}.lock"))
        except OSError as e:
            # A cache that cannot be written (a read-only image prebuilt with
            # `python -m core_ops build`): load what is there, or use the reference.
            if _complete(library) and not force:
                return _load(kind, library, warn)
            return _unavailable(kind, f"the build cache {root} is not writable ({e}); set "
                                "CORE_OPS_CACHE_DIR to a writable folder", warn)
        return _ensure_locked(kind, name, build_dir, library, build=build, force=force, arch=arch,
                              warn=warn, retry_failed=retry_failed)


def _load(kind: str, library: Path, warn: bool, what: str | None = None) -> Backend:
    try:
        torch.ops.load_library(str(library))
    except Exception as e:  # noqa: BLE001
        return _unavailable(kind, f"library {library} failed to load: {e}; `python -m core_ops build "
                            "--force` builds one here", warn)
    if what is None:
        what = f"native: built here, {library}"
        if _wheel_not_taken.get(kind):
            what += f" (the wheel's library not taken: {_wheel_not_taken[kind]})"
    if kind == "cpu":
        level = cpu_level()
        if level.startswith("none"):
            return _unavailable(kind, f"{library} holds no kernels this CPU runs: {level}", warn)
        what += f"; level {level}"
    _backends[kind] = Backend(True, what, str(library))
    return _backends[kind]


# Why each kind's wheel library was not taken, for the report of the JIT one.
_wheel_not_taken: dict[str, str] = {}


def forced_jit() -> bool:
    """Whether native kernels must come from the JIT cache, not the wheel: asked for
    (CORE_OPS_BACKEND=jit), or a sanitized build (CORE_OPS_SANITIZE=1) wanted."""
    return settings.core("backend") == "jit" or settings.core("sanitize") == "1"


def _jit_reason() -> str:
    return "CORE_OPS_SANITIZE=1" if settings.core("sanitize") == "1" else "CORE_OPS_BACKEND=jit"


def cpu_level() -> str:
    """The level the loaded CPU library registered, and why (Note [CPU levels])."""
    return torch.ops.core_ops.native_cpu_level(torch.empty(0))


def _ensure_locked(kind: str, name: str, build_dir: Path, library: Path, *, build: bool,
                   force: bool, arch: str | None, warn: bool, retry_failed: bool) -> Backend:
    failed = build_dir / "FAILED"
    if failed.exists() and not (force or retry_failed):
        return _unavailable(kind, f"an earlier build failed, log in {failed}; "
                            "`python -m core_ops build` retries", warn)
    if _complete(library) and not force:
        _mark_portable(kind, build_dir, arch)  # libraries built before the marker existed
        return _load(kind, library, warn)
    if not build:
        return _unavailable(kind, "not built yet: it builds on first use, or "
                            "run `python -m core_ops build`", warn=False)
    # Linked in a staging folder and moved into place whole, so no process ever
    # finds a half-written library under the final name.
    staging = build_dir / "staging"
    print(f"core_ops: building native {kind.upper()} kernels once "
          f"(cached in {build_dir}) ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        _cache_trust.make_private(staging)
        failed.unlink(missing_ok=True)
        _compile(kind, name, staging, arch)
        os.replace(staging / f"{name}.so", library)
        _mark_portable(kind, build_dir, arch)
    except Exception as e:  # noqa: BLE001  (any failure means: use the reference)
        with contextlib.suppress(OSError):
            failed.write_text(str(e))
        return _unavailable(kind, f"build failed: {_cause(e)} (log in {failed})", warn)
    print(f"core_ops: built native {kind.upper()} kernels in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return _load(kind, library, warn)


def ensure_for(device: torch.device) -> None:
    """Called by every public op before dispatch: make the device's native kernels
    available if they can be. Raises only for a mistyped CORE_OPS_BACKEND (a build
    failure falls back instead); never builds while torch.compile traces."""
    kind = device.type
    if kind in _backends or kind not in KINDS:
        return
    if torch.compiler.is_compiling():
        return
    ensure(kind)
