"""Apex's O1 registration functions on top of torch.autocast: a function named by the
user runs in half, in float32, or in the widest floating type of its arguments
whenever autocast is on, with autocast off inside it (as Apex's own casting lists
did). Outside autocast the function runs untouched.

Apex required these calls before ``amp.initialize``; here they may come at any time.
They replace the attribute ``name`` of ``module`` by a wrapper (once per function,
which is all Apex's API ever did); nothing else in torch is patched. The decorators
``half_function`` / ``float_function`` / ``promote_function`` wrap a function the
same way.
"""

from __future__ import annotations

import functools

import torch

from .model_casting import cast_tree, floating_tensors

_AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_on():
    """The device type whose autocast is on, or None."""
    for device_type in _AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(device_type):
            return device_type
    return None


def _half_dtype(device_type):
    # The dtype of the autocast in effect is that of the O1 model running, whichever
    # initialize call (there may be several) it came from.
    return torch.get_autocast_dtype(device_type)


def _widest(args, kwargs):
    dtypes = [t.dtype for t in floating_tensors((args, kwargs))]
    widest = dtypes[0] if dtypes else None
    for d in dtypes[1:]:
        widest = torch.promote_types(widest, d)
    return widest


def _wrap(fn, cast):
    if getattr(fn, "_core_ops_amp_cast", None) is not None:
        fn = fn.__wrapped__  # registered before: the latest registration wins

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        device_type = _autocast_on()
        if device_type is None:
            return fn(*args, **kwargs)
        dtype = cast(device_type, args, kwargs)
        if dtype is not None:
            args, kwargs = cast_tree(args, dtype), cast_tree(kwargs, dtype)
        with torch.autocast(device_type, enabled=False):
            return fn(*args, **kwargs)

    wrapper._core_ops_amp_cast = cast
    return wrapper


def _register(module, name, cast):
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{getattr(module, '__name__', module)!r} has no function named {name!r}")
    setattr(module, name, _wrap(fn, cast))


def _to_half(device_type, args, kwargs):
    return _half_dtype(device_type)


def _to_float(device_type, args, kwargs):
    return torch.float32


def _to_widest(device_type, args, kwargs):
    return _widest(args, kwargs)


def register_half_function(module, name):
    """``module.name`` runs in the half dtype under O1 (Apex's FP16 list)."""
    _register(module, name, _to_half)


def register_float_function(module, name):
    """``module.name`` runs in float32 under O1 (Apex's FP32 list)."""
    _register(module, name, _to_float)


def register_promote_function(module, name):
    """``module.name`` runs in the widest floating type of its arguments under O1."""
    _register(module, name, _to_widest)


# Apex's decorators ("Annotating user functions"): the same casts for a function of
# one's own, e.g. a custom kernel that only takes fp16 (@amp.half_function).

def half_function(fn):
    """Decorator: ``fn`` runs in the half dtype whenever autocast (O1) is on."""
    return _wrap(fn, _to_half)


def float_function(fn):
    """Decorator: ``fn`` runs in float32 whenever autocast (O1) is on."""
    return _wrap(fn, _to_float)


def promote_function(fn):
    """Decorator: ``fn`` runs in the widest floating type of its arguments whenever
    autocast (O1) is on."""
    return _wrap(fn, _to_widest)
