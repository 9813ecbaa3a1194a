"""Every place core_ops changes what torch does by wrapping its code or writing its
private state: one module a patch.

Note [Patches to torch]: each module of this package declares a ``PATCH``
(``_patch.Patch``): the torch releases it applies to (checked before patching: a
release outside them is left unpatched, with a warning), what torch lacks (a
reproducer in ``tools/upstream/`` or an upstream issue) and what a run loses without
it. A patch is idempotent (a marker attribute on what it wraps, ``functools.wraps`` so
that ``__wrapped__`` leads back) and undone by its ``uninstall``. One switch leaves any
of them out: the environment variable ``CORE_OPS_TORCH_PATCHES_OFF``, a comma-separated
list of ``NAMES`` (the modules' names), or ``all``. docs/torch-patches.md lists them,
with the route each one leaves when it is off.
"""

from ._patch import NAMES, VARIABLE, Patch, switched_off

__all__ = ["NAMES", "Patch", "VARIABLE", "switched_off"]

switched_off()  # a name that is no patch stops the import, as a misspelt variable does
