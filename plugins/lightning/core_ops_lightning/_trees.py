"""The plugin's classes for every Lightning tree installed, made from one definition
(``precision.py``, ``strategies.py``) and named in the module that serves the tree."""

import types

from . import _compat
from .precision import precision_classes
from .strategies import strategy_classes

# tree name -> (module of its Trainer classes, module of its Fabric classes)
MODULES = {"lightning": ("core_ops_lightning.pytorch", "core_ops_lightning.fabric"),
           "pytorch_lightning": ("core_ops_lightning.pytorch_lightning", "core_ops_lightning.lightning_fabric")}


def _classes(tree):
    trainer_module, fabric_module = MODULES[tree.name]
    precision, fabric_precision = precision_classes(tree.trainer, tree.fabric, trainer_module)
    fabric_precision.__module__ = fabric_module
    ddp, fabric_ddp, sync_bn, no_sync, fsdp, fabric_fsdp = strategy_classes(tree.trainer, tree.fabric, trainer_module)
    fabric_ddp.__module__ = no_sync.__module__ = fabric_fsdp.__module__ = fabric_module
    return types.SimpleNamespace(ApexPrecision=precision, ApexFabricPrecision=fabric_precision,
                                 ApexDDPStrategy=ddp, ApexFabricDDPStrategy=fabric_ddp,
                                 CoreOpsSyncBatchNorm=sync_bn, FabricNoSync=no_sync, ApexFSDPStrategy=fsdp,
                                 ApexFabricFSDPStrategy=fabric_fsdp)


ALL = {tree: _classes(tree) for tree in _compat.installed_trees()}
BY_NAME = {tree.name: ns for tree, ns in ALL.items()}


def classes(name):
    if name not in BY_NAME:
        raise ImportError(f"the {name!r} package is not installed (pip install {name.replace('_', '-')})")
    return BY_NAME[name]
