"""The plugin's classes for ``lightning.fabric``: ``Fabric(plugins=[ApexPrecision('O2')],
strategy=ApexDDPStrategy())`` (or ``precision='apex-O2', strategy='apex-ddp'``)."""

from ._trees import classes

_ns = classes("lightning")
ApexPrecision = _ns.ApexFabricPrecision
ApexDDPStrategy = _ns.ApexFabricDDPStrategy
ApexFSDPStrategy = _ns.ApexFabricFSDPStrategy
_NoSync = _ns.FabricNoSync  # found by name when the strategy is pickled (apex-ddp_spawn)
