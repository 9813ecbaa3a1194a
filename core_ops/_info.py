"""What runs where, and why: the report behind ``python -m core_ops info``."""

import platform

import torch

from . import _build, torch_fused
from ._library import LIB_NAME, OP_NAMES

_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def _cache_line():
    """The cache used, and why: private instead of the one set, or shared by a team."""
    from . import _cache_trust
    root, why = _build.cache()
    if why is not None:
        return f"{root} (private: {_build.cache_root()} is not used: {why})"
    return f"{root} (shared with a team: CORE_OPS_SHARED_CACHE=1)" if _cache_trust.shared() else str(root)


def op_backend(name, kind):
    """Which tier of Note [Backend tiers] (torch_fused.py) ``name`` takes on ``kind``:
    'native' if the dispatcher holds a C++ kernel for the device, else 'torch (<its
    kernel>) where the call fits, else reference' for an op torch has a fused kernel
    of, else 'reference'."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"{LIB_NAME}::{name}", _DISPATCH_KEYS[kind]):
        return "native"
    if name in torch_fused.KERNELS and not _build.forced_reference():
        return f"torch ({torch_fused.COVERS[name]}) where the call fits, else reference"
    return "reference"


def backend_report(build=True):
    """A dict: versions, cache path, and for every device kind the library status and
    each op's backend. With ``build``, CPU kernels are built if missing (CUDA only
    when a GPU is present), so the report says what a real call would get."""
    from importlib.metadata import version  # the installed distribution's (pyproject's)
    report = {
        "core-ops": version("core-ops"),
        "torch": torch.__version__,
        "cuda (torch build)": str(torch.version.cuda),
        "cuda toolkit": _build.cuda_home() or "not found",
        "c++ compiler": _build._first_line([_build.cxx() or "c++", "--version"]) or "not found",
        "python": platform.python_version(),
        "cpu capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "cache": _cache_line(),
        "devices": {},
    }
    for kind in _build.KINDS:
        wanted = build and (kind == "cpu" or torch.cuda.is_available())
        backend = _build.ensure(kind, build=wanted, warn=False)
        if kind == "cuda" and not torch.cuda.is_available():
            # Nothing here would build or run it: say so, promise nothing "on first use".
            note = ("native library loaded (no GPU here to run it)" if backend.native else
                    "no GPU here: CUDA kernels are built on a machine with one (`python -m core_ops build "
                    "--cuda` builds them here anyway, for another machine)")
        else:
            note = backend.reason
        report["devices"][kind] = {
            "library": note,
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
        for name, backend in dev["ops"].items():
            lines.append(f"  {name:<32} {backend}")
    lines.append("\n" + format_settings())
    return "\n".join(lines)
