"""``import core_ops.compat.apex`` makes Apex's import paths resolve to core_ops, so an
Apex training script runs unmodified: ``import apex``, ``from apex import amp``,
``apex.optimizers``, ``apex.parallel``, ``apex.normalization``,
``apex.multi_tensor_apply``, and the extension modules ``amp_C`` and ``apex_C``.
``python -m core_ops.compat.apex script.py [args]`` runs a script with them in place.

``apex.<name>.<sub>`` maps to ``core_ops.<name>.<sub>``; what core_ops does not have
(``apex.contrib``, ``apex.fp16_utils``, ...) fails to import with a message that says so.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

import torch

PACKAGES = ("amp", "optimizers", "parallel", "normalization", "multi_tensor_apply")
EXTENSIONS = {"amp_C": "core_ops.multi_tensor_apply.amp_C"}


def _apex_c():
    """Apex's ``apex_C``: the flatten / unflatten helpers of its old DDP code."""
    module = types.ModuleType("apex_C", "core_ops' stand-in for Apex's apex_C extension")
    module.flatten = torch._utils._flatten_dense_tensors
    module.unflatten = torch._utils._unflatten_dense_tensors
    return module


def _target(fullname):
    """The core_ops module behind an Apex module name, or None if not ours to serve."""
    if fullname in EXTENSIONS:
        return importlib.import_module(EXTENSIONS[fullname])
    if fullname == "apex_C":
        return _apex_c()
    if fullname == "apex":
        module = types.ModuleType("apex", "core_ops standing in for NVIDIA Apex")
        module.__path__ = []  # a package, so that apex.<name> is looked up by the finder
        return module
    if not fullname.startswith("apex."):
        return None
    rest = fullname[len("apex."):]
    if rest.split(".")[0] not in PACKAGES:
        raise ModuleNotFoundError(
            f"No module named '{fullname}': core_ops replaces Apex's "
            f"{', '.join('apex.' + p for p in PACKAGES)}, amp_C and apex_C, not "
            f"apex.{rest.split('.')[0]}", name=fullname)
    try:
        return importlib.import_module(f"core_ops.{rest}")
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"No module named '{fullname}' (core_ops has no "
                                  f"core_ops.{rest}: {e})", name=fullname) from None


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system an existing module. The import system stamps the new
    spec onto it; exec_module puts the module's own spec back, so core_ops.amp stays
    core_ops.amp (for pickling, reloading, error messages) while also being apex.amp."""

    def __init__(self, module):
        self.module = module
        self.own_spec = getattr(module, "__spec__", None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        if self.own_spec is not None:
            module.__spec__ = self.own_spec


class ApexAliasFinder(importlib.abc.MetaPathFinder):
    """Serves ``apex``, ``apex.*``, ``amp_C`` and ``apex_C`` from core_ops."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in ("apex", "amp_C", "apex_C"):
            return None
        module = _target(fullname)
        if module is None:
            return None
        # The module keeps its own __name__ and __spec__ (it is also core_ops.<name>).
        spec = importlib.util.spec_from_loader(fullname, _AliasLoader(module))
        if fullname == "apex":
            module.__spec__ = spec
            module.__loader__ = spec.loader
        return spec


def install():
    """Puts the finder first on ``sys.meta_path`` (idempotent); an installed real Apex
    is shadowed from then on."""
    if not any(isinstance(f, ApexAliasFinder) for f in sys.meta_path):
        for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
            del sys.modules[name]  # a real Apex imported earlier would otherwise win
        sys.meta_path.insert(0, ApexAliasFinder())


install()
