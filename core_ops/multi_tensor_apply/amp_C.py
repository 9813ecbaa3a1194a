"""Apex's ``amp_C`` extension functions, with Apex's signatures, on core_ops' kernels.

Each takes ``(chunk_size, noop_flag, tensor_lists, *args)``; ``noop_flag`` is Apex's
one-element int32 overflow flag, set to 1 on inf or nan. As in Apex, norms come back
as one-element tensors.
"""

import math

from . import ops


def _lists(tensor_lists, depth, name):
    if not isinstance(tensor_lists, (list, tuple)) or len(tensor_lists) != depth:
        raise ValueError(f"{name} takes {depth} tensor lists, got "
                         f"{len(tensor_lists) if isinstance(tensor_lists, (list, tuple)) else tensor_lists!r}")
    return tensor_lists


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    src, dst = _lists(tensor_lists, 2, "multi_tensor_scale")
    ops.multi_tensor_scale(src, dst, scale, found_inf=noop_flag)


def multi_tensor_axpby(chunk_size, noop_flag, tensor_lists, a, b, arg_to_check):
    x, y, out = _lists(tensor_lists, 3, "multi_tensor_axpby")
    ops.multi_tensor_axpby(x, y, out, a, b, found_inf=noop_flag, arg_to_check=arg_to_check)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    (tensors,) = _lists(tensor_lists, 1, "multi_tensor_l2norm")
    total, per = ops.multi_tensor_l2norm(tensors, per_tensor)
    return total.reshape(1), per


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    """Apex's semantics: the norm of ``t * inv_scale``, without writing ``t``."""
    (tensors,) = _lists(tensor_lists, 1, "multi_tensor_unscale_l2norm")
    total, per = ops.multi_tensor_l2norm(tensors, per_tensor)
    if tensors:
        total, per = total * inv_scale, per * inv_scale
    return total.reshape(1), per


def update_scale_hysteresis(current_scale, growth_tracker, hysteresis_tracker, found_inf,
                            growth_factor, backoff_factor, growth_interval, hysteresis):
    ops.update_scale(current_scale, growth_tracker, found_inf, growth_factor=growth_factor,
                     backoff_factor=backoff_factor, growth_interval=growth_interval,
                     hysteresis=hysteresis, hysteresis_tracker=hysteresis_tracker,
                     min_scale=0.0, max_scale=math.inf)
    return current_scale
