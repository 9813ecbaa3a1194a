"""What runs where, and why: the report behind ``python -m core_ops info``."""

import platform

import torch

from . import native, torch_fused
from ._schemas import LIB_NAME, OP_NAMES
from .native import cache, toolchain

_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def _cache_line():
    """The cache used, and why: private instead of the one set, or shared by a team."""
    root, why = cache.root()
    if why is not None:
        return f"{root} (private: {cache.configured_root()} is not used: {why})"
    return f"{root} (shared with a team: CORE_OPS_SHARED_CACHE=1)" if cache.shared() else str(root)


def op_backend(name, kind):
    """Which backend of Note [Backends] (native/__init__.py) serves ``name`` on ``kind``:
    'native' if the dispatcher holds a C++ kernel for the device (backend 1 or 2), else
    '3 torch (<its kernel>) where the call fits, else 4 reference' for an op torch has a
    fused kernel of, else '4 reference'."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"{LIB_NAME}::{name}", _DISPATCH_KEYS[kind]):
        return "native"
    if name in torch_fused.KERNELS and not native.forced_reference():
        return f"3 torch ({torch_fused.COVERS[name]}) where the call fits, else 4 reference"
    return "4 reference"


def backend_report(build=True):
    """A dict: versions, cache path, and for every device kind the native backend taken
    (or why none was), why each before it was passed over, and each op's backend. With
    ``build``, CPU kernels are built if missing (CUDA only when a GPU is present), so the
    report says what a real call would get."""
    from importlib.metadata import version  # the installed distribution's (pyproject's)
    report = {
        "core-ops": version("core-ops"),
        "torch": torch.__version__,
        "cuda (torch build)": str(torch.version.cuda),
        "cuda toolkit": toolchain.cuda_home() or "not found",
        "c++ compiler": toolchain.version_line([toolchain.cxx() or "c++", "--version"]) or "not found",
        "python": platform.python_version(),
        "cpu capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "cache": _cache_line(),
        "devices": {},
    }
    for kind in native.KINDS:
        wanted = build and (kind == "cpu" or torch.cuda.is_available())
        backend = native.ensure(kind, native.Request(build=wanted), warn=False)
        if kind == "cuda" and not torch.cuda.is_available():
            # Nothing here would build or run it: say so, promise nothing "on first use".
            note = ("native library loaded (no GPU here to run it)" if backend.native else
                    "no GPU here: CUDA kernels are built on a machine with one (`python -m core_ops build "
                    "--cuda` builds them here anyway, for another machine)")
        else:
            note = backend.reason
        report["devices"][kind] = {
            "library": note,
            "passed over": list(backend.passed_over),
            "ops": {name: op_backend(name, kind) for name in OP_NAMES},
        }
    return report


def format_settings(environ=None):
    """Every setting with its value here: the variable's, or unset (its default then)."""
    from . import settings
    lines = ["settings (an argument in code wins over its variable; docs/settings.md):"]
    for env, value, readers in settings.report(environ):
        lines.append(f"  {env:<36} {value:<12} read by {readers}")
    return "\n".join(lines)


def format_report(report):
    lines = [f"{k:>20}: {v}" for k, v in report.items() if k != "devices"]
    for kind, dev in report["devices"].items():
        lines.append(f"\n[{kind}] {dev['library']}")
        lines += [f"  passed over: {why}" for why in dev["passed over"]]
        for name, backend in dev["ops"].items():
            lines.append(f"  {name:<32} {backend}")
    lines.append("\n" + format_settings())
    return "\n".join(lines)
