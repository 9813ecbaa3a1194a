"""``import apex`` in every process, with no launcher: the core-ops-apex-alias
distribution's .pth calls ``install()`` at each interpreter's start-up, so an unchanged
Apex script run by ``python``, ``torchrun``, ``accelerate launch`` or ``deepspeed``, the
processes it starts, and libraries that import Apex themselves (transformers 4.x's
``optim="adamw_apex_fused"``) get core_ops.compat.apex's alias (docs/apex-migration.md).

Note [An alias that never shadows Apex]: start-up puts one finder first on
``sys.meta_path`` and imports nothing else (no core_ops, no torch: a .pth runs in every
Python process). The first import of one of Apex's top-level names asks the other
finders for ``apex``. If one finds a module outside core_ops, an Apex is installed
(NVIDIA's, or PyPI's unrelated ``apex``): the finder says so once and leaves the import
system, for ``amp_C`` and Apex's other extension modules too, so that the two are never
mixed. Otherwise it imports core_ops.compat.apex, whose finder serves that import and
every later one. The distribution's build refuses an environment that already has an
``apex`` distribution (setup.py), but a wheel runs no code when it is installed: this
check at import is what holds for a wheel installed beside Apex, or an Apex installed
after it. ``CORE_OPS_AUTOLOAD=0`` turns the alias off, as it does the plugins' autoload.
"""

import importlib.util
import os
import sys
import warnings

import core_ops_autoload

# Apex's top-level names that core_ops.compat.apex serves (its _SHIMMED), written out:
# reading them from there would import torch at start-up.
NAMES = frozenset({"apex", "apex_C", "amp_C", "fused_layer_norm_cuda", "fused_adam_cuda", "syncbn"})


def install():
    """Puts the finder first on ``sys.meta_path`` (idempotent). ``CORE_OPS_AUTOLOAD=0``
    is read at the first import of an Apex name, not at start-up (reading the settings
    costs about 15 ms, which every Python process would pay)."""
    if not any(isinstance(f, AliasOnFirstImport) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasOnFirstImport())


def installed_apex(finder):
    """Where the ``apex`` that the import system would load without ``finder`` lives,
    or None when there is none to respect: no ``apex`` at all, a bare directory named
    apex (a namespace package, no code), or core_ops' own stand-in (the one that
    ``python -m core_ops.compat.apex`` puts on the path for its child processes)."""
    spec = core_ops_autoload.spec_without(finder, "apex")
    if spec is None or spec.origin is None:
        return None
    ours = importlib.util.find_spec("core_ops")  # finds, does not import
    homes = [os.path.join(os.path.realpath(h), "") for h in (ours.submodule_search_locations or [])] if ours else []
    where = os.path.realpath(spec.origin)
    return None if any(where.startswith(h) for h in homes) else os.path.dirname(where)


class AliasOnFirstImport:  # a meta path finder: find_spec is all the import system asks
    def find_spec(self, name, path=None, target=None):
        if name not in NAMES:
            return None
        if self in sys.meta_path:  # asked once: from here on core_ops' finder, or nobody
            sys.meta_path.remove(self)
        if not core_ops_autoload.enabled():
            return None
        real = installed_apex(self)
        if real is not None:
            warnings.warn(
                f"core-ops-apex-alias: an `apex` package is installed ({real}), so `import apex` gets it and "
                "core-ops' alias stays out of the way (for amp_C and Apex's other extension modules too). "
                "To run on core-ops, `pip uninstall apex`; to keep that Apex, `pip uninstall core-ops-apex-alias`.",
                stacklevel=2)
            return None
        alias = importlib.import_module("core_ops.compat.apex")  # puts its finder first
        return alias.ApexAliasFinder().find_spec(name, path, target)
