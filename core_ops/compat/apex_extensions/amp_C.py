"""Apex's ``amp_C`` extension functions, with Apex's signatures, on core_ops' kernels
(``import amp_C`` under core_ops.compat.apex is this module).

Each takes ``(chunk_size, noop_flag, tensor_lists, *args)``; ``noop_flag`` is Apex's
one-element int32 overflow flag, set to 1 on inf or nan. As in Apex, norms come back
as one-element tensors.

The optimizer kernels (Adam and its capturable variants, SGD, Adagrad, LAMB in one
call or two stages, the mixed-precision LAMB, NovoGrad) are in
``amp_C_optimizers.py`` and exported here.
"""

import math

import torch

from ..._validate import noop_flag as checked_noop_flag
from ...multi_tensor_apply import ops
from .amp_C_optimizers import (  # noqa: F401  (amp_C's names)
    multi_tensor_adagrad,
    multi_tensor_adam,
    multi_tensor_adam_capturable,
    multi_tensor_adam_capturable_master,
    multi_tensor_lamb,
    multi_tensor_lamb_mp,
    multi_tensor_lamb_stage1_cuda,
    multi_tensor_lamb_stage2_cuda,
    multi_tensor_novograd,
    multi_tensor_sgd,
)
from ._args import tensor_lists_of


def _noop(noop_flag_, tensors):
    """Apex's noop_flag, checked alike by every function here: one float32 or int32
    element on the tensors' device (a larger flag was once set whole by the norms and
    refused by scale)."""
    if not tensors:  # an empty call reads no flag, as the ops
        return noop_flag_
    return checked_noop_flag(noop_flag_, tensors[0].device)


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    src, dst = tensor_lists_of(tensor_lists, 2, "multi_tensor_scale")
    ops.multi_tensor_scale(src, dst, scale, found_inf=_noop(noop_flag, src))


def multi_tensor_axpby(chunk_size, noop_flag, tensor_lists, a, b, arg_to_check):
    x, y, out = tensor_lists_of(tensor_lists, 3, "multi_tensor_axpby")
    ops.multi_tensor_axpby(x, y, out, a, b, found_inf=_noop(noop_flag, x), arg_to_check=arg_to_check)


def _flag_nonfinite(noop_flag, norm, tensors):
    # Apex's norm kernels set the flag when a norm is not finite (on the device).
    if noop_flag is not None:
        _noop(noop_flag, tensors).masked_fill_(~torch.isfinite(norm.to(noop_flag.device)).reshape(()), 1)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    (tensors,) = tensor_lists_of(tensor_lists, 1, "multi_tensor_l2norm")
    total, per = ops.multi_tensor_l2norm(tensors, per_tensor)
    _flag_nonfinite(noop_flag, total, tensors)
    return total.reshape(1), per


def multi_tensor_l2norm_scale(chunk_size, noop_flag, tensor_lists, scale, per_tensor=False):
    """Apex's: ``out = in * scale`` for ``[in, out]``, and the L2 norms of ``in`` as it
    was before scaling (``in`` and ``out`` may be the same tensors)."""
    src, dst = tensor_lists_of(tensor_lists, 2, "multi_tensor_l2norm_scale")
    total, per = ops.multi_tensor_l2norm(src, per_tensor)
    if src:
        ops.multi_tensor_scale(src, dst, scale)
    _flag_nonfinite(noop_flag, total, src)
    return total.reshape(1), per


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    """Apex's semantics: the norm of ``t * inv_scale``, without writing ``t``."""
    (tensors,) = tensor_lists_of(tensor_lists, 1, "multi_tensor_unscale_l2norm")
    total, per = ops.multi_tensor_l2norm(tensors, per_tensor)
    if tensors:
        total, per = total * inv_scale, per * inv_scale
    _flag_nonfinite(noop_flag, total, tensors)
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
