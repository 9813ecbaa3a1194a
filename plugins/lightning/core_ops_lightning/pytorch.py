"""The plugin's classes for ``lightning.pytorch`` (the Trainer of the ``lightning`` package)."""

from ._trees import classes

_ns = classes("lightning")
ApexPrecision = _ns.ApexPrecision
ApexDDPStrategy = _ns.ApexDDPStrategy
ApexFSDPStrategy = _ns.ApexFSDPStrategy
CoreOpsSyncBatchNorm = _ns.CoreOpsSyncBatchNorm
