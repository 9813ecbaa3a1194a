"""Which backend serves a device type's ops (Note [Backends] in native/__init__.py): the
native libraries are tried in order, each saying why it was passed over, and the first
that loads serves every op of its device type; with none, each op runs on backend 3
or 4.

Note [Prebuilt libraries]: a wheel made by tools/wheel.sh holds, in core_ops/lib/, the
CPU library (every x86-64 level, Note [CPU levels]) and, in a full wheel, the CUDA 13
library (SASS for the archs BUILD.json lists), all built on torch's stable ABI for
torch TARGET and newer (Note [Stable ABI]), with BUILD.json saying so. Backend 1 takes
them when this torch is at least the target, and for CUDA when torch's CUDA major is
the library's. They are loaded from the installed package only, never from a cache:
the package's folder is the installer's, as every other file of it. A source install
(pip install ., tools/setup.sh) has no core_ops/lib and builds at first use (backend 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

from .. import settings
from . import build, cache, toolchain

KINDS = ("cpu", "cuda")
LIB_DIR = Path(__file__).resolve().parent.parent / "lib"
MANIFEST = LIB_DIR / "BUILD.json"


@dataclasses.dataclass(frozen=True)
class Backend:
    """What serves a device type's ops: a native library (backend 1 or 2) or none (each op
    on backend 3 or 4), why, and why each native backend before it was passed over."""
    native: bool
    reason: str
    path: str | None = None
    passed_over: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Request:
    """What a caller asks of backend 2: build its library if missing; build it again
    (and pass over backend 1); for these CUDA archs (a build: backend 1 passed over);
    retry a build that failed before."""
    build: bool = True
    rebuild: bool = False
    arch: str | None = None
    retry_failed: bool = False


class NotTaken(Exception):
    """Why a backend was passed over. ``quiet``: expected, not worth a warning (a library
    not built yet where a look, not a build, was asked for)."""

    def __init__(self, why: str, quiet: bool = False):
        super().__init__(why)
        self.why, self.quiet = why, quiet


LOOK = Request(build=False)
_settled: dict[str, Backend] = {}  # the outcome for each device type, once per process


def forced_reference() -> bool:
    """Whether CORE_OPS_BACKEND asks for the pure-PyTorch reference everywhere (a value
    outside the setting's is refused by it: a typo must not run native kernels
    without a word)."""
    return settings.core("backend") == "reference"


def _forced_jit() -> str | None:
    """Why native kernels must come from backend 2, not 1: asked for
    (CORE_OPS_BACKEND=jit), or a sanitized build (CORE_OPS_SANITIZE=1) wanted."""
    if settings.core("sanitize") == "1":
        return "CORE_OPS_SANITIZE=1"
    return "CORE_OPS_BACKEND=jit" if settings.core("backend") == "jit" else None


# ---- backend 1: the wheel's library ---------------------------------------------------------

def manifest() -> dict | None:
    try:
        return json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return None


def wheel_library(kind: str) -> tuple[Path | None, str]:
    """(the wheel's library for ``kind``, what it is) when this process can load it,
    else (None, why not)."""
    built = manifest()
    if built is None:
        return None, "no prebuilt library in this install (a source install builds at first use)"
    entry = built.get("libraries", {}).get(kind)
    if entry is None:
        return None, f"this wheel has no {kind.upper()} library (a --cpu-only wheel)"
    target = built["torch_target"]
    if toolchain.release(torch.__version__) < toolchain.release(target):
        return None, f"torch {torch.__version__} is older than the wheel's libraries (torch >= {target})"
    if platform.machine().lower() not in entry.get("machines", []):
        return None, f"the wheel's library is for {', '.join(entry.get('machines', []))}, not {platform.machine()}"
    if kind == "cuda":
        if torch.version.cuda is None:
            return None, "this torch has no CUDA"
        if torch.version.cuda.split(".")[0] != str(entry["cuda_major"]):
            return None, (f"torch's CUDA is {torch.version.cuda}, the wheel's library is for CUDA "
                          f"{entry['cuda_major']}: built here instead")
    path = LIB_DIR / entry["file"]
    if not path.is_file():
        return None, f"{path} is missing from the install"
    what = f"the wheel's, {path}, built with torch {built['built_with_torch']} for torch >= {target}"
    if kind == "cuda":
        what += f", SASS for sm_{', sm_'.join(entry['sass'])}"
    return path, what


def _wheel(kind: str, request: Request) -> tuple[Path, str]:
    library, what = wheel_library(kind)
    if library is None:
        raise NotTaken(what)
    if request.rebuild or request.arch:
        raise NotTaken("a build was asked for")
    if _forced_jit():
        raise NotTaken(_forced_jit())
    return library, f"native: {what}"


# ---- backend 2: the library built here, in the cache ----------------------------------------

def _jit(kind: str, request: Request) -> tuple[Path, str]:
    what = "native: built here, {}"
    problem = toolchain.missing(kind)
    if problem:
        prebuilt = None if request.rebuild else cache.prebuilt(kind, request.arch)
        if prebuilt is None:
            raise NotTaken(problem)
        return prebuilt, what.format(prebuilt)
    try:
        name = cache.library_name(kind, request.arch)
    except OSError as e:
        raise NotTaken(f"cannot read kernel sources: {e}") from None
    root, _ = cache.root()
    # A folder or library in it that someone else could have written is not loaded: it
    # is built again privately (Note [A cache no one else writes]).
    root, _ = cache.choose(root, cache.default_root(), root / name / f"{name}.so")
    build_dir = root / name
    library = build_dir / f"{name}.so"
    failed = build_dir / "FAILED"
    not_built = NotTaken("not built yet: it builds on first use, or run `python -m core_ops build`", quiet=True)
    if not request.build and not request.rebuild:  # a look, not a build: the cache is read, never written
        if cache.complete(library) and not failed.exists():
            return library, what.format(library)
        raise not_built
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(cache.lock(root / f"{name}.lock"))
        except OSError as e:
            # A cache that cannot be written (a read-only image prebuilt with
            # `python -m core_ops build`): load what is there, or pass it over.
            if cache.complete(library) and not request.rebuild:
                return library, what.format(library)
            raise NotTaken(f"the build cache {root} is not writable ({e}); set "
                           "CORE_OPS_CACHE_DIR to a writable folder") from None
        if failed.exists() and not (request.rebuild or request.retry_failed):
            raise NotTaken(f"an earlier build failed, log in {failed}; `python -m core_ops build` retries")
        if cache.complete(library) and not request.rebuild:
            cache.mark_portable(kind, build_dir, request.arch)  # libraries built before the marker existed
            return library, what.format(library)
        _build_staged(kind, name, build_dir, request.arch)
    return library, what.format(library)


def _build_staged(kind: str, name: str, build_dir: Path, arch: str | None) -> None:
    """Builds into a staging folder and moves the library into place whole, so no
    process ever finds a half-written library under the final name."""
    failed, staging = build_dir / "FAILED", build_dir / "staging"
    print(f"core_ops: building native {kind.upper()} kernels once "
          f"(cached in {build_dir}) ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        cache.make_private(staging)
        failed.unlink(missing_ok=True)
        build.library(kind, name, staging, arch)
        os.replace(staging / f"{name}.so", build_dir / f"{name}.so")
        cache.mark_portable(kind, build_dir, arch)
    except Exception as e:  # noqa: BLE001  (any failure means: pass backend 2 over)
        with contextlib.suppress(OSError):
            failed.write_text(str(e))
        raise NotTaken(f"build failed: {build.cause(e)} (log in {failed})") from None
    print(f"core_ops: built native {kind.upper()} kernels in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


# ---- choosing ----------------------------------------------------------------------------------

NATIVE = (("1 wheel", _wheel), ("2 jit", _jit))  # Note [Backends]: tried in this order


def _load(kind: str, library: Path, what: str) -> str:
    """Loads ``library``; returns ``what`` with the CPU level it registered."""
    try:
        torch.ops.load_library(str(library))
    except Exception as e:  # noqa: BLE001
        raise NotTaken(f"library {library} failed to load: {e}; `python -m core_ops build "
                       "--force` builds one here") from None
    if kind == "cpu":
        level = cpu_level()
        if level.startswith("none"):
            raise NotTaken(f"{library} holds no kernels this CPU runs: {level}")
        what += f"; level {level}"
    return what


def ensure(kind: str, request: Request = Request(), warn: bool = True) -> Backend:
    """The backend serving ``kind``'s ops, loading (and building, as ``request`` says)
    the first native library that can. Cheap after the first call: the outcome is
    remembered for the process."""
    if kind in _settled and not request.rebuild:
        return _settled[kind]
    if forced_reference():
        return _settle(kind, Backend(False, "CORE_OPS_BACKEND=reference"))
    passed: list[str] = []
    for name, find in NATIVE:
        try:
            library, what = find(kind, request)
            what = _load(kind, library, what)
        except NotTaken as e:
            passed.append(f"{name}: {e.why}")
            last = e
            continue
        return _settle(kind, Backend(True, what, str(library), tuple(passed)))
    if warn and not last.quiet:
        warnings.warn(f"core_ops: native {kind.upper()} kernels unavailable ({last.why}); "
                      "every op runs on the pure-PyTorch reference", RuntimeWarning, stacklevel=3)
    return _settle(kind, Backend(False, last.why, None, tuple(passed)))


def _settle(kind: str, backend: Backend) -> Backend:
    _settled[kind] = backend
    return backend


def cpu_level() -> str:
    """The level the loaded CPU library registered, and why (Note [CPU levels])."""
    return torch.ops.core_ops.native_cpu_level(torch.empty(0))


def ensure_for(device: torch.device) -> None:
    """Called by every public op before dispatch: make the device's native kernels
    available if they can be. Raises only for a mistyped CORE_OPS_BACKEND (a build
    failure falls back instead); never builds while torch.compile traces."""
    kind = device.type
    if kind in _settled or kind not in KINDS:
        return
    if torch.compiler.is_compiling():
        return
    ensure(kind)
