"""The ``CORE_OPS_*`` environment checked against the settings' one declaration
(``core_ops.settings``), so that a mistyped variable is an error that lists the valid
names instead of a setting silently ignored (checked when core_ops is imported, and by
the plugins' autoload when the host framework is imported). The values of the
variables core_ops itself reads are checked here too; the others where their route
reads them (``settings.resolve``)."""

from . import settings

KNOWN = frozenset(settings.BY_ENV)
BadEnvironment = settings.BadEnvironment  # (declared with the settings)
check = settings.check_environment  # (the settings read their variables; this names the entry)


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