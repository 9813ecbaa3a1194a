"""core-ops for PyTorch Lightning: Apex's opt levels as precision plugins and core_ops'
DistributedDataParallel as a strategy, for the Trainer and Fabric::

    trainer = L.Trainer(precision="apex-O2", strategy="apex-ddp", sync_batchnorm=True)
    fabric = L.Fabric(precision="apex-O2-bf16", strategy="apex-ddp", devices=2)
    trainer = L.Trainer(plugins=[ApexPrecision("O2", half_dtype=torch.bfloat16, loss_scale="dynamic")])
    trainer = L.Trainer(strategy=ApexDDPStrategy(message_size=2**24, allreduce_dtype=torch.bfloat16))

The names work without importing this package: the installed package loads itself
when Lightning is imported (Note [Plugin autoload] in core_ops_autoload.py;
``CORE_OPS_AUTOLOAD=0`` turns that off, and then ``import core_ops_lightning``
registers them). The classes here are those of the ``lightning`` package; ``core_ops_lightning.fabric``
holds Fabric's under the same names, and ``core_ops_lightning.pytorch_lightning`` /
``core_ops_lightning.lightning_fabric`` those of the standalone packages (an
``ApexPrecision`` given to the other tree or framework is rebuilt for it anyway).
"""

import warnings

from . import _compat, _trees
from .names import NAMES

__version__ = "0.1.0"

PROBLEMS = _compat.install(_trees.ALL)
if PROBLEMS:
    warnings.warn("core_ops_lightning could not hook into this Lightning (" + "; ".join(PROBLEMS) +
                  "): precision='apex-...' and strategy='apex-ddp' are not registered. Pass the "
                  "objects instead: Trainer(plugins=[ApexPrecision('O2')], strategy=ApexDDPStrategy())",
                  stacklevel=2)

from .pytorch import ApexDDPStrategy, ApexFSDPStrategy, ApexPrecision, CoreOpsSyncBatchNorm  # noqa: E402

__all__ = ["ApexDDPStrategy", "ApexFSDPStrategy", "ApexPrecision", "CoreOpsSyncBatchNorm", "NAMES"]
