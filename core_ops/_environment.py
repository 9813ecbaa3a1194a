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
}
# Read by core_ops_accelerate: ApexPlugin's options (its plugin.FIELDS; a test holds the
# two equal).
ACCELERATE = frozenset({
    "CORE_OPS_OPT_LEVEL", "CORE_OPS_HALF_DTYPE", "CORE_OPS_LOSS_SCALE", "CORE_OPS_KEEP_BATCHNORM_FP32",
    "CORE_OPS_MASTER_WEIGHTS", "CORE_OPS_MIN_LOSS_SCALE", "CORE_OPS_MAX_LOSS_SCALE", "CORE_OPS_SYNC_BN",
    "CORE_OPS_FUSED_OPTIMIZER", "CORE_OPS_MESSAGE_SIZE", "CORE_OPS_DELAY_ALLREDUCE",
    "CORE_OPS_ALLREDUCE_ALWAYS_FP32", "CORE_OPS_ALLREDUCE_DTYPE", "CORE_OPS_GRADIENT_PREDIVIDE_FACTOR",
})
KNOWN = frozenset(CORE) | ACCELERATE
# The variables with a fixed set of values (the others are checked where they are read).
VALUES = {"CORE_OPS_AUTOLOAD": ("0", "1"), "CORE_OPS_VERBOSE_BUILD": ("0", "1")}


def check(environ=os.environ):
    """Raises ValueError naming each unknown ``CORE_OPS_*`` variable, the closest valid
    name and the whole list, or a value outside ``VALUES``."""
    for name, allowed in VALUES.items():
        if name in environ and environ[name].strip() not in allowed:
            raise ValueError(f"{name}={environ[name]!r}: expected one of {', '.join(allowed)} ({CORE[name]})")
    unknown = sorted(k for k in environ if k.startswith("CORE_OPS_") and k not in KNOWN)
    if not unknown:
        return
    hints = []
    for name in unknown:
        # Compared without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(name[len("CORE_OPS_"):], [k[len("CORE_OPS_"):] for k in KNOWN], n=1,
                                          cutoff=0.7)
        hints.append(f"{name}" + (f" (did you mean CORE_OPS_{close[0]}?)" if close else ""))
    raise ValueError(f"unknown environment variable{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                     f"core-ops reads {', '.join(sorted(CORE))} and, in Accelerate, "
                     f"{', '.join(sorted(ACCELERATE))}")
