"""Every ``CORE_OPS_*`` environment variable, so that a mistyped one is an error that
lists the valid names instead of a setting silently ignored (checked when core_ops is
imported). Values are checked where they are read (``_build.reference_everywhere``,
``core_ops_accelerate.plugin``, ``core_ops_autoload``)."""

import difflib
import os

CORE = {
    "CORE_OPS_BACKEND": "auto (default) or reference: the pure-PyTorch kernels everywhere",
    "CORE_OPS_CACHE_DIR": "where native kernels are built and cached",
    "CORE_OPS_CUDA_ARCH": "the CUDA archs to build for, e.g. 9.0 or 8.0;9.0",
    "CORE_OPS_VERBOSE_BUILD": "1: show the compiler's output",
    "CORE_OPS_AUTOLOAD": "0: the plugins do not load themselves (core_ops_autoload.py)",
    "CORE_OPS_TORCH_PATCHES_OFF": "patches to torch to leave out: names of core_ops.torch_patches, comma-separated, "
                                  "or all (docs/torch-patches.md)",
}
# Read by both plugins (Lightning's ApexPrecision, Accelerate's ApexPlugin): the guards
# against non-finite grads, on by default there (Note [Skipping non-finite steps]).
PLUGINS = {
    "CORE_OPS_SKIP_NONFINITE": "0 / 1 (default): skip steps whose grads hold an inf or nan, at every opt level",
    "CORE_OPS_MAX_CONSECUTIVE_SKIPS": "N: stop after N skipped steps in a row (default 50; 0: never stop)",
}
# The plugins' default of max_consecutive_skips: far beyond the skips of a healthy fp16
# run's start (the scale falls from 2**16 by halves: 50 skips take it to 2**-34).
MAX_CONSECUTIVE_SKIPS = 50
# Read by core_ops_accelerate: ApexPlugin's options (its plugin.FIELDS; a test holds the
# two equal).
ACCELERATE = frozenset(PLUGINS) | frozenset({
    "CORE_OPS_OPT_LEVEL", "CORE_OPS_HALF_DTYPE", "CORE_OPS_LOSS_SCALE", "CORE_OPS_KEEP_BATCHNORM_FP32",
    "CORE_OPS_MASTER_WEIGHTS", "CORE_OPS_MIN_LOSS_SCALE", "CORE_OPS_MAX_LOSS_SCALE", "CORE_OPS_SYNC_BN",
    "CORE_OPS_FUSED_OPTIMIZER", "CORE_OPS_MESSAGE_SIZE", "CORE_OPS_DELAY_ALLREDUCE",
    "CORE_OPS_ALLREDUCE_ALWAYS_FP32", "CORE_OPS_ALLREDUCE_DTYPE", "CORE_OPS_GRADIENT_PREDIVIDE_FACTOR",
})
KNOWN = frozenset(CORE) | ACCELERATE
# The variables with a fixed set of values (the others are checked where they are read).
VALUES = {"CORE_OPS_AUTOLOAD": ("0", "1"), "CORE_OPS_VERBOSE_BUILD": ("0", "1")}


class BadEnvironment(ValueError):
    """A ``CORE_OPS_*`` variable that is misspelt or holds a value outside its set
    (core_ops_autoload.py stops the host's import on it, by this name)."""


def check(environ=os.environ):
    """Raises ValueError naming each unknown ``CORE_OPS_*`` variable, the closest valid
    name and the whole list, or a value outside ``VALUES``."""
    for name, allowed in VALUES.items():
        if name in environ and environ[name].strip() not in allowed:
            raise BadEnvironment(f"{name}={environ[name]!r}: expected one of {', '.join(allowed)} ({CORE[name]})")
    unknown = sorted(k for k in environ if k.startswith("CORE_OPS_") and k not in KNOWN)
    if not unknown:
        return
    hints = []
    for name in unknown:
        # Compared without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(name[len("CORE_OPS_"):], [k[len("CORE_OPS_"):] for k in KNOWN], n=1,
                                          cutoff=0.7)
        hints.append(f"{name}" + (f" (did you mean CORE_OPS_{close[0]}?)" if close else ""))
    raise BadEnvironment(f"unknown environment variable{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                     f"core-ops reads {', '.join(sorted(CORE))}; in Lightning and Accelerate, "
                     f"{', '.join(sorted(PLUGINS))}; in Accelerate also "
                     f"{', '.join(sorted(ACCELERATE - frozenset(PLUGINS)))}")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def flag(value, name):
    """A switch given as a bool or as a variable's text (1 / true / yes / on, 0 / ...)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE + _FALSE:
        return text in _TRUE
    raise ValueError(f"{name}={value!r}: expected one of {', '.join(_TRUE + _FALSE)}")


def skip_limit(value, name):
    """A max_consecutive_skips value for the plugins: an int >= 0, 0 meaning never stop
    (None, amp's spelling)."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError
        limit = int(value)
        if limit < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an int >= 1, or 0 to never stop") from None
    return limit or None


def plugin_guards(options, environ=os.environ):
    """``options`` (amp options) with the plugins' defaults of skip_nonfinite and
    max_consecutive_skips filled in from CORE_OPS_SKIP_NONFINITE /
    CORE_OPS_MAX_CONSECUTIVE_SKIPS or, unset, on (50 skips in a row stop the run)."""
    out = dict(options)
    if out.get("skip_nonfinite") is None:
        out["skip_nonfinite"] = flag(environ.get("CORE_OPS_SKIP_NONFINITE", "1"), "CORE_OPS_SKIP_NONFINITE")
    else:
        out["skip_nonfinite"] = flag(out["skip_nonfinite"], "skip_nonfinite")
    if "max_consecutive_skips" not in out:
        env = environ.get("CORE_OPS_MAX_CONSECUTIVE_SKIPS")
        out["max_consecutive_skips"] = (MAX_CONSECUTIVE_SKIPS if env is None else
                                        skip_limit(env, "CORE_OPS_MAX_CONSECUTIVE_SKIPS"))
    elif out["max_consecutive_skips"] is not None:
        out["max_consecutive_skips"] = skip_limit(out["max_consecutive_skips"], "max_consecutive_skips")
    return out


def plugins_without_autoload(modules=None, find_spec=None, environ=os.environ):
    """The core-ops plugins importable here whose autoload ``.pth`` never ran (an
    editable install, ``pip install -e``, cannot carry it): their apex-* names and
    CORE_OPS_OPT_LEVEL do nothing until they are imported."""
    import importlib.util
    import sys
    modules = sys.modules if modules is None else modules
    find_spec = importlib.util.find_spec if find_spec is None else find_spec
    if "core_ops_autoload" in modules or environ.get("CORE_OPS_AUTOLOAD", "1").strip() == "0":
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