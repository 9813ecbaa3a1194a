"""Run a function once a module has been imported, without importing it: for patches
and registrations in torch's inductor, whose modules take seconds to import and which
most runs never load."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``module`` as Python would and calls ``then()`` once it has executed."""

    def __init__(self, module, then):
        self.module, self.then = module, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # one use: the module loads once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            self.then()

        spec.loader.exec_module = exec_module
        return spec


def when_imported(module, then):
    """``then()`` now if ``module`` is loaded, else right after something imports it
    (once per ``then``)."""
    if module in sys.modules:
        then()
    elif not any(isinstance(f, _AfterImport) and f.then is then for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(module, then))
