"""``import core_ops.compat.apex`` makes Apex's import paths resolve to core_ops, so an
Apex training script runs unmodified: ``import apex``, ``from apex import amp``,
``apex.optimizers``, ``apex.parallel``, ``apex.normalization``,
``apex.multi_tensor_apply``, ``apex.mlp``, ``apex.fp16_utils``, ``apex.contrib``, and the
extension modules ``amp_C``, ``apex_C``, ``fused_layer_norm_cuda``, ``fused_adam_cuda`` and ``syncbn``.
``python -m core_ops.compat.apex script.py [args]`` runs a script with them in place.

``apex.<name>.<sub>`` maps to ``core_ops.<name>.<sub>``, and Apex's module paths that
core_ops lays out differently map through ``SUBMODULES``; ``apex.parallel`` is
``core_ops.compat.apex.parallel`` (``APEX_SIGNATURES``), core_ops.parallel with a
DistributedDataParallel that takes Apex's arguments in Apex's order; what core_ops does not have
(``apex.transformer``, ``apex.RNN``, ...) fails to import with a message that says so.
Apex's legacy APIs (``apex.fp16_utils``, the parts of ``apex.contrib`` that public code
imports, ``apex._autocast_utils``) live in this package (``LEGACY``), and its compiled
extension modules that code calls directly have stand-ins (``EXTENSIONS``, in
core_ops.compat.apex_extensions).
As in Apex, ``import apex`` alone gives ``apex.amp``, ``apex.parallel`` and the rest
(imported on first access).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types

PACKAGES = ("amp", "optimizers", "parallel", "normalization", "multi_tensor_apply", "mlp")
# Apex's legacy APIs, which core_ops keeps only for Apex scripts: apex.<name>[.<sub>] is
# core_ops.compat.apex.<name>[.<sub>].
LEGACY = ("fp16_utils", "contrib", "_autocast_utils")
# Apex's compiled extension modules, imported by their top-level names.
EXTENSIONS = {name: f"core_ops.compat.apex_extensions.{name}"
              for name in ("amp_C", "apex_C", "fused_layer_norm_cuda", "fused_adam_cuda", "syncbn")}
# Apex modules whose contents core_ops keeps elsewhere (or in its package itself).
SUBMODULES = {
    "apex.amp._amp_state": "core_ops.amp._state",
    "apex.amp.scaler": "core_ops.amp.loss_scaler",
    "apex.multi_tensor_apply.multi_tensor_apply": "core_ops.multi_tensor_apply.applier",
    "apex.normalization.fused_layer_norm": "core_ops.normalization",
    "apex.optimizers.fused_mixed_precision_lamb": "core_ops.optimizers.fused_lamb",
    "apex.parallel.LARC": "core_ops.optimizers.larc",
    "apex.parallel.distributed": "core_ops.compat.apex.parallel",
    "apex.parallel.optimized_sync_batchnorm": "core_ops.parallel.sync_batchnorm",
}


# Apex packages served by a module of this package, not by core_ops.<name> itself: their
# classes take Apex's arguments in Apex's order (core_ops' own drop the retired ones).
APEX_SIGNATURES = {"apex.parallel": "core_ops.compat.apex.parallel"}


class _Alias(types.ModuleType):
    """``apex.<path>`` for one of ``SUBMODULES``: a module of its own whose attributes
    are the target's, imported on first access. Registered in ``sys.modules`` before
    any import, so the import system never sets it as an attribute of its parent:
    ``import apex.parallel.LARC`` must not turn ``core_ops.parallel.LARC`` (the class)
    into a module."""

    def __init__(self, name, target):
        super().__init__(name, f"Apex's {name}: core_ops' {target}")
        self.__target = target

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        module = importlib.import_module(self.__target)
        try:
            return getattr(module, attr)
        except AttributeError:
            raise AttributeError(f"module {self.__name__!r} (core_ops' {self.__target}) has no "
                                 f"attribute {attr!r}") from None

    def __dir__(self):
        return dir(importlib.import_module(self.__target))


def _apex_package():
    module = types.ModuleType("apex", "core_ops standing in for NVIDIA Apex")
    module.__path__ = []  # a package, so that apex.<name> is looked up by the finder

    def __getattr__(name):  # apex.amp etc. without importing them first, as in Apex
        if name in PACKAGES or name in LEGACY:
            return importlib.import_module(f"apex.{name}")
        raise AttributeError(f"module 'apex' has no attribute {name!r}")

    module.__getattr__ = __getattr__
    return module


def _target(fullname):
    """The core_ops module behind an Apex module name, or None if not ours to serve."""
    if fullname in EXTENSIONS:
        return importlib.import_module(EXTENSIONS[fullname])
    if fullname == "apex":
        return _apex_package()
    if fullname in APEX_SIGNATURES:
        return importlib.import_module(APEX_SIGNATURES[fullname])
    if not fullname.startswith("apex."):
        return None
    rest = fullname[len("apex."):]
    top = rest.split(".")[0]
    if top not in PACKAGES and top not in LEGACY:
        raise ModuleNotFoundError(
            f"No module named '{fullname}': core_ops replaces Apex's "
            f"{', '.join('apex.' + p for p in PACKAGES + LEGACY)}, {', '.join(EXTENSIONS)}, "
            f"not apex.{top}", name=fullname)
    home = "core_ops.compat.apex" if top in LEGACY else "core_ops"
    try:
        return importlib.import_module(f"{home}.{rest}")
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"No module named '{fullname}' (core_ops has no "
                                  f"{home}.{rest}: {e})", name=fullname) from None


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
        if fullname.split(".")[0] not in _SHIMMED:
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
    """Puts the finder first on ``sys.meta_path`` and the ``SUBMODULES`` aliases in
    ``sys.modules`` (idempotent); an installed real Apex is shadowed from then on."""
    if not any(isinstance(f, ApexAliasFinder) for f in sys.meta_path):
        for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
            del sys.modules[name]  # a real Apex imported earlier would otherwise win
        sys.meta_path.insert(0, ApexAliasFinder())
    for name, target in SUBMODULES.items():
        if not isinstance(sys.modules.get(name), _Alias):
            sys.modules[name] = _Alias(name, target)


# Note [Children of the runner]: a process that torch.multiprocessing.spawn or a
# spawn/forkserver DataLoader starts is a fresh interpreter that re-imports the
# script's main module, so the parent's finder is not in it. SHIM_DIR holds real
# top-level ``apex``, ``amp_C`` and ``apex_C`` modules that install the finder and
# replace themselves by their alias; the runner puts SHIM_DIR on PYTHONPATH (for any
# child interpreter) and on sys.path (which multiprocessing hands to its children).
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")
_SHIMMED = ("apex", *EXTENSIONS)


def serve_from_path(name):
    """Called by a module of SHIM_DIR while it is being imported as ``name``."""
    if name not in _SHIMMED:
        return  # imported by its package path (a tool walking core_ops): nothing to serve
    install()
    sys.modules.pop(name, None)  # the shim itself, half imported
    sys.modules[name] = importlib.import_module(name)  # now through the finder


def export_to_children():
    """Makes ``import apex`` work in child interpreters (Note [Children of the runner])."""
    if SHIM_DIR not in sys.path:
        sys.path.insert(0, SHIM_DIR)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if SHIM_DIR not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([SHIM_DIR] + [p for p in paths if p])


install()
