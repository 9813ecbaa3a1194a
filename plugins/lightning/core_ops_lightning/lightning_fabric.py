"""The plugin's classes for the standalone ``lightning_fabric`` package."""

from ._trees import classes

_ns = classes("pytorch_lightning")
ApexPrecision = _ns.ApexFabricPrecision
ApexDDPStrategy = _ns.ApexFabricDDPStrategy
ApexFSDPStrategy = _ns.ApexFabricFSDPStrategy
_NoSync = _ns.FabricNoSync  # found by name when the strategy is pickled (apex-ddp_spawn)
