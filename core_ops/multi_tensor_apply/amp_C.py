"""Apex's ``amp_C`` extension functions, with Apex's signatures, on core_ops' kernels
(``import amp_C`` under core_ops.compat.apex is this module).

Each takes ``(chunk_size, noop_flag, tensor_lists, *args)``; ``noop_flag`` is Apex's
one-element int32 overflow flag, set to 1 on inf or nan. As in Apex, norms come back
as one-element tensors.

The optimizer kernels are in ``amp_C_optimizers.py`` and exported here.

Not here, because no core_ops op computes the same thing: ``multi_tensor_lamb`` and
``multi_tensor_lamb_mp`` (Apex's one-call LAMB clips by a global norm and applies the
trust ratio inside one kernel; use ``core_ops.optimizers.FusedLAMB``),
``multi_tensor_novograd`` (its ``grad_norms`` argument is the blended second moment
Apex's Python computed beforehand), ``multi_tensor_l2norm_scale``, and the two LAMB
stage kernels.
"""

import math

from . import ops
from .amp_C_optimizers import multi_tensor_adagrad, multi_tensor_adam, multi_tensor_sgd  # noqa: F401
from .applier import tensor_lists_of


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    src, dst = tensor_lists_of(tensor_lists, 2, "multi_tensor_scale")
    ops.multi_tensor_scale(src, dst, scale, found_inf=noop_flag)


def multi_tensor_axpby(chunk_size, noop_flag, tensor_lists, a, b, arg_to_check):
    x, y, out = tensor_lists_of(tensor_lists, 3, "multi_tensor_axpby")
    ops.multi_tensor_axpby(x, y, out, a, b, found_inf=noop_flag, arg_to_check=arg_to_check)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    (tensors,) = tensor_lists_of(tensor_lists, 1, "multi_tensor_l2norm")
    total, per = ops.multi_tensor_l2norm(tensors, per_tensor)
    return total.reshape(1), per


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    """Apex's semantics: the norm of ``t * inv_scale``, without writing ``t``."""
    (tensors,) = tensor_lists_of(tensor_lists, 1, "multi_tensor_unscale_l2norm")
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


# Apex's _mp variant takes half inputs and returns float32 norms, which the plain
# one already does here (norms accumulate in float32, Note [Multi-tensor conventions]).
multi_tensor_l2norm_mp = multi_tensor_l2norm


