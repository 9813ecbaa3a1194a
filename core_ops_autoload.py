"""Loads a core-ops plugin when its host framework is imported, so that
``Trainer(precision="apex-O2")`` works without ``import core_ops_lightning`` and any
Accelerate script runs with ``ApexPlugin`` when ``CORE_OPS_OPT_LEVEL`` is set.

Note [Plugin autoload]: as torch's out-of-tree backend autoload, the installed plugin
registers itself and the host's import applies it; ``CORE_OPS_AUTOLOAD=0`` turns it off.
Neither Lightning nor Accelerate reads a plugin registry before it parses
``precision=`` or builds an Accelerator, so each plugin's wheel carries a ``.pth`` file
(run by Python's ``site`` at start-up) that calls ``when_imported`` here. That adds one
finder to ``sys.meta_path`` and imports nothing else: a process that never imports the
host pays a dictionary lookup per import. When the outermost host module has finished
executing, the plugin is imported (and a ``module:function`` hook called); a plugin
that fails to import warns and leaves the host's import alone.

This module is top-level and imports only the standard library: importing
``core_ops`` (and torch) from a ``.pth`` would slow every Python process. Start-up
reads no setting either: the settings are read when a host is imported, from
``core_ops/settings.py`` loaded alone (``settings()``: it imports only the standard
library; about 15 ms, next to the host's seconds).
"""

import sys

OFF = "CORE_OPS_AUTOLOAD"
_SETTINGS = []


def settings():
    """core_ops' settings (``core_ops/settings.py``), without importing core_ops: the
    package's own module when core_ops is imported, else a private copy of it."""
    if "core_ops.settings" in sys.modules:
        return sys.modules["core_ops.settings"]
    if not _SETTINGS:
        import importlib.util
        import os
        package = importlib.util.find_spec("core_ops")  # finds, does not import
        path = os.path.join(package.submodule_search_locations[0], "settings.py")
        spec = importlib.util.spec_from_file_location("_core_ops_autoload_settings", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
        _SETTINGS.append(module)
    return _SETTINGS[0]


def enabled():
    """Off only for ``CORE_OPS_AUTOLOAD=0``. Another value than 0 or 1 warns here (an
    error would stop the host's import) and ``import core_ops`` refuses it."""
    try:
        return settings().core("autoload") != "0"
    except ValueError as e:
        import warnings
        warnings.warn(f"{e}: autoload stays on", stacklevel=2)
        return True


def when_imported(hosts, plugin, only_if_set=None):
    """Imports ``plugin`` ("module" or "module:function", the function then called)
    once any module of ``hosts`` has been imported; with ``only_if_set`` (the variable
    that switches the plugin on), only when a ``CORE_OPS_*`` variable is set. Nothing
    when autoload is off.

    Note [Settings that stop the run]: a ``CORE_OPS_*`` variable that is set takes
    effect or stops the run with its name. So with any of them set the host's import
    also checks their names (``core_ops._environment.check``: a misspelt
    ``CORE_OPS_OPT_LEVLE`` would otherwise leave an fp32 run that looks fine) and
    loads the plugin, which refuses a variable it reads set without ``only_if_set``; a
    plugin asked for through ``only_if_set`` that fails to load fails the host's
    import with the variable's name instead of warning, and its message stays the last
    line the user reads (``said_last``). Whether autoload is on, and whether a
    variable is set, is read when the host is imported (start-up reads nothing)."""
    if any(isinstance(f, _HostFinder) and f.plugin == plugin for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _HostFinder(hosts, plugin, only_if_set))


def spec_without(finder, name, path=None, target=None):
    """The spec the import system would use for ``name`` if ``finder`` were not on
    ``sys.meta_path``, or None: what a finder that wraps or stands aside must look up."""
    for other in sys.meta_path:
        if other is not finder and hasattr(other, "find_spec"):
            spec = other.find_spec(name, path, target)
            if spec is not None:
                return spec
    return None


class _HostFinder:  # a meta path finder: find_spec is all the import system asks
    def __init__(self, hosts, plugin, only_if_set=None):
        self.hosts, self.plugin, self.only_if_set = frozenset(hosts), plugin, only_if_set
        self.depth, self.done = 0, False

    def find_spec(self, name, path, target=None):
        if self.done or name not in self.hosts:
            return None
        spec = spec_without(self, name, path, target)
        if spec is None:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _AfterLoader(spec.loader, self)
        return spec

    def _load_plugin(self):
        self.done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        import importlib
        import warnings
        module, _, function = self.plugin.partition(":")
        importing = sys.modules.get(module)
        if importing is not None and getattr(getattr(importing, "__spec__", None), "_initializing", False):
            return  # the plugin imports the host itself (python -m core_ops_accelerate): it is loading
        if not enabled() or (self.only_if_set and not settings().any_set()):
            return
        asked_with = settings().variable(self.only_if_set) if self.only_if_set else None
        requested = asked_with is not None
        try:
            # Every name is checked; the plugin then loads whenever a variable is set, so
            # that one it reads without the one that switches it on stops the run too.
            importlib.import_module("core_ops._environment").check()
            loaded = importlib.import_module(module)
            if function:
                getattr(loaded, function)()
        except Exception as e:
            # Note [Settings that stop the run]: a setting that cannot take effect stops
            # the run; otherwise the user's import of the host must not fail for us.
            if requested or type(e).__name__ == "BadEnvironment":
                asked = (f"{self.only_if_set}={asked_with!r} asks for {module}"
                         if requested else "the CORE_OPS_* settings")
                message = f"core-ops: {asked}, which failed: {type(e).__name__}: {e}"
                said_last(message)
                raise RuntimeError(message) from e
            warnings.warn(f"core-ops could not load {module} ({type(e).__name__}: {e}); set {OFF}=0 to stop "
                          "trying, or import it yourself to see the whole error", stacklevel=3)


def said_last(message):
    """Makes ``message`` the last line of the traceback of an uncaught error that holds
    it in its chain. A host that imports lazily (transformers imports accelerate inside
    ``__getattr__``) catches our error and raises its own, e.g. "Could not import module
    'GPT2LMHeadModel'", whose line would otherwise be the last the user reads."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        seen, error = set(), value
        while error is not None and id(error) not in seen:
            if message in str(error) and error is not value:
                sys.stderr.write(f"\n{message}\n")
                break
            seen.add(id(error))
            error = error.__cause__ or error.__context__

    hook._core_ops_message = message
    if getattr(previous, "_core_ops_message", None) != message:
        sys.excepthook = hook


class _AfterLoader:
    """The host's own loader, which then loads the plugin once the outermost host
    module has executed (``lightning`` imports ``lightning.fabric`` first, and
    ``pytorch_lightning`` imports ``lightning_fabric``)."""

    def __init__(self, loader, finder):
        self._loader, self._finder = loader, finder

    def __getattr__(self, name):  # get_resource_reader, is_package, ... as the host's loader
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        finder = self._finder
        finder.depth += 1
        try:
            self._loader.exec_module(module)
        finally:
            finder.depth -= 1
        if finder.depth == 0 and not finder.done:
            finder._load_plugin()
