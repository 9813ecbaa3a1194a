"""Note [Norms under inductor]: core-ops' norm ops are custom ops, opaque to inductor,
which cannot fuse them with the ops around them as it fuses ``nn.RMSNorm`` /
``nn.LayerNorm``; on a CPU that made a compiled transformer step with FusedRMSNorm
1.05x the compiled step with ``nn.RMSNorm`` (bench/bench_compile.py). So when inductor
is loaded its decomposition table gets the norm ops' pure-PyTorch references
(core_ops/reference/norms.py, the same math in the same accumulation dtype): inductor
generates and fuses them, while eager runs, ``aot_eager`` and every other backend keep
the native kernels. Compiled results then differ from eager's by roundings (inductor
orders the reductions its own way), as ``nn.RMSNorm``'s do. torch has no public way to
give a custom op a decomposition for inductor alone
(tools/upstream/inductor_custom_op_opaque.py).
"""

from __future__ import annotations

import torch

from ._on_import import when_imported
from ._patch import Patch

WHEN_OFF = ("inductor calls the norm ops' native kernels as opaque calls, unfused with the ops around them (a "
            "compiled CPU transformer step with FusedRMSNorm took 1.05x the step with nn.RMSNorm); results are "
            "eager's bit for bit.")
PATCH = Patch(__name__, ("2.10", "2.16"), "tools/upstream/inductor_custom_op_opaque.py", WHEN_OFF)

_MODULE = "torch._inductor.decomposition"


def _ops():
    from ..reference import norms
    return {getattr(torch.ops.core_ops, name).default: reference for name, reference in norms.KERNELS.items()}


def _table():
    try:
        from torch._inductor import decomposition
    except Exception:  # noqa: BLE001 (no inductor: nothing to register)
        return None
    return decomposition


def installed():
    decomposition = _table()
    return decomposition is not None and all(op in decomposition.decompositions for op in _ops())


def install():
    """Puts the references in inductor's decomposition table (idempotent); returns
    whether they are there."""
    decomposition = _table()
    if decomposition is None or not PATCH.active():
        return False
    for op, reference in _ops().items():
        if op not in decomposition.decompositions:
            decomposition.register_decomposition(op)(reference)
    _forget_copies(decomposition)
    return True


def _forget_copies(decomposition):
    """inductor caches a copy of the table (``fast_random_decomps``) at its first
    compile: it is made again from the table as it is now."""
    cached = getattr(decomposition, "fast_random_decomps", None)
    if callable(getattr(cached, "cache_clear", None)):
        cached.cache_clear()


def install_when_imported():
    when_imported(_MODULE, install)


def uninstall():
    decomposition = _table()
    if decomposition is not None:
        for op in _ops():
            decomposition.decompositions.pop(op, None)
        _forget_copies(decomposition)
