"""Note [Norms under inductor]: core-ops' norm ops are custom ops, opaque to inductor,
which cannot fuse them with the ops around them as it fuses ``nn.RMSNorm`` /
``nn.LayerNorm``; on a CPU that made a compiled transformer step with FusedRMSNorm
1.05x the compiled step with ``nn.RMSNorm`` (bench/bench_compile.py). So when inductor
is loaded its decomposition table gets the norm ops' pure-PyTorch references
(core_ops/reference/norms.py, the same math in the same accumulation dtype): inductor
generates and fuses them, while eager runs, ``aot_eager`` and every other backend keep
the native kernels. Compiled results then differ from eager's by roundings (inductor
orders the reductions its own way), as ``nn.RMSNorm``'s do.
"""

from __future__ import annotations

import torch

from .on_import import when_imported

_MODULE = "torch._inductor.decomposition"


def register():
    """Puts the references in inductor's decomposition table (idempotent); returns
    whether they are there."""
    try:
        from torch._inductor import decomposition
    except Exception:  # noqa: BLE001 (no inductor: nothing to register)
        return False
    from ..reference import norms
    for name, reference in norms.KERNELS.items():
        op = getattr(torch.ops.core_ops, name).default
        if op not in decomposition.decompositions:
            decomposition.register_decomposition(op)(reference)
    return True


def register_when_imported():
    when_imported(_MODULE, register)
