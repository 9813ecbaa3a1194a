"""A workaround for a torch inductor bug on CPUs that stops bfloat16 / float16 models
from compiling (tools/upstream/inductor_cpu_twin_reduction.py reproduces it):

Note [Inductor's twin reductions]: when two outputs of a kernel are one and the same
vertical reduction (two Linear biases fed the same gradient, as in GPT-NeoX's parallel
residual, give two identical bias-gradient sums), inductor computes the sum once and
stores it twice; for a reduced-precision output its vector codegen
(``CppVecKernel.store_reduction``) declares ``auto at_BFloat16_<acc> = convert(...)``
before each store, in one scope, and the C++ compile fails with "conflicting
declaration". ``install()`` wraps each such store's lines in their own braces, so the
declaration is local to its store; the generated arithmetic is unchanged. core_ops
asks for it (``install_when_imported``) where it makes half models (amp at O2 / O3, and
the plugins through it): inductor's codegen takes 1.3 s to import, so it is patched
when something imports it, not before. Idempotent; a torch whose codegen lacks that
method is left untouched; ``uninstall()`` undoes it.
"""

from __future__ import annotations

import functools

from ._on_import import when_imported
from ._patch import Patch

WHEN_OFF = ("inductor fails to compile, on a CPU, a half model with two outputs that are one reduction (two "
            "Linear biases fed one gradient, as GPT-NeoX's parallel residual): compile it in float32, or with "
            "another backend (aot_eager).")
PATCH = Patch(__name__, ("2.10", "2.16"), "tools/upstream/inductor_cpu_twin_reduction.py", WHEN_OFF)

_MARK = "_core_ops_scoped_reduction_stores"
_MODULE = "torch._inductor.codegen.cpp"


def _kernel_class():
    try:
        from torch._inductor.codegen.cpp import CppVecKernel
    except Exception:  # noqa: BLE001 (no inductor, or another layout: nothing to patch)
        return None
    return CppVecKernel if callable(getattr(CppVecKernel, "store_reduction", None)) else None


def installed():
    cls = _kernel_class()
    return cls is not None and getattr(cls.store_reduction, _MARK, False)


def install():
    """Applies the workaround; returns whether inductor is patched now."""
    cls = _kernel_class()
    if cls is None or not PATCH.active():
        return False
    if installed():
        return True
    original = cls.store_reduction

    @functools.wraps(original)
    def store_reduction(self, name, index, value):
        lines = self.reduction_suffix._lines
        start = len(lines)
        original(self, name, index, value)
        added = lines[start:]
        if any("auto " in str(getattr(line, "line", line)) for line in added):
            from torch._inductor.codegen.common import DeferredLine
            lines[start:] = [DeferredLine(name, "{"), *added, DeferredLine(name, "}")]

    setattr(store_reduction, _MARK, True)
    cls.store_reduction = store_reduction
    return True


def install_when_imported():
    """``install()`` now if inductor's CPU codegen is loaded, else when it is imported."""
    when_imported(_MODULE, install)


def uninstall():
    if installed():
        cls = _kernel_class()
        cls.store_reduction = cls.store_reduction.__wrapped__
