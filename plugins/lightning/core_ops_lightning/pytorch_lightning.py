"""The plugin's classes for the standalone ``pytorch_lightning`` package."""

from ._trees import classes

_ns = classes("pytorch_lightning")
ApexPrecision = _ns.ApexPrecision
ApexDDPStrategy = _ns.ApexDDPStrategy
ApexFSDPStrategy = _ns.ApexFSDPStrategy
CoreOpsSyncBatchNorm = _ns.CoreOpsSyncBatchNorm
