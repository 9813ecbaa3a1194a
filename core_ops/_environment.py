"""The ``CORE_OPS_*`` environment checked against the settings' one declaration
(``core_ops.settings``), so that a mistyped variable is an error that lists the valid
names instead of a setting silently ignored (checked when core_ops is imported, and by
the plugins' autoload when the host framework is imported). The values of the
variables core_ops itself reads are checked here too; the others where their route
reads them (``settings.resolve``)."""

import difflib
import os

from . import settings

KNOWN = frozenset(settings.BY_ENV)


BadEnvironment = settings.BadEnvironment  # (declared with the settings)


def check(environ=None):
    """Raises BadEnvironment naming each unknown ``CORE_OPS_*`` variable, the closest
    valid name and the whole list, or a bad value of a variable core_ops reads itself."""
    environ = os.environ if environ is None else environ
    for setting in settings.SETTINGS:
        if settings.CORE in setting.readers and setting.env in environ and environ[setting.env].strip():
            try:
                setting.parse(environ[setting.env], setting.env)
            except ValueError as e:
                raise BadEnvironment(f"{e} ({setting.doc})") from None
    unknown = sorted(k for k in environ if k.startswith("CORE_OPS_") and k not in KNOWN)
    if not unknown:
        return
    hints = []
    for name in unknown:
        # Compared without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(name[len("CORE_OPS_"):], [k[len("CORE_OPS_"):] for k in KNOWN], n=1,
                                          cutoff=0.7)
        hints.append(f"{name}" + (f" (did you mean CORE_OPS_{close[0]}?)" if close else ""))
    by_reader = {}
    for setting in settings.SETTINGS:
        by_reader.setdefault(setting.readers[0], []).append(setting.env)
    readers = "; ".join(f"{who}: {', '.join(sorted(envs))}" for who, envs in by_reader.items())
    raise BadEnvironment(f"unknown environment variable{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                         f"core-ops reads ({readers}; docs/settings.md)")


def plugins_without_autoload(modules=None, find_spec=None, environ=None):
    """The core-ops plugins importable here whose autoload ``.pth`` never ran (an
    editable install, ``pip install -e``, cannot carry it): their apex-* names and
    CORE_OPS_OPT_LEVEL do nothing until they are imported."""
    import importlib.util
    import sys
    modules = sys.modules if modules is None else modules
    find_spec = importlib.util.find_spec if find_spec is None else find_spec
    if "core_ops_autoload" in modules or settings.core("autoload", environ) == "0":
        return []
    return [name for name in ("core_ops_lightning", "core_ops_accelerate")
            if name not in modules and find_spec(name) is not None]


def warn_plugins_without_autoload():
    missing = plugins_without_autoload()
    if missing:
        import warnings
        files = ", ".join(f"core-ops-{m.split('_')[-1]}-autoload.pth" for m in missing)
        warnings.warn(f"{', '.join(missing)} installed without its autoload file ({files} is not in "
                      "site-packages: an editable install cannot carry it), so precision='apex-*' and "
                      "CORE_OPS_OPT_LEVEL do nothing until it is imported; install it without -e, run "
                      "tools/setup.sh, or import it in the script", stacklevel=3)