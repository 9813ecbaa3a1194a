"""Apex's ``syncbn`` extension (its SyncBatchNorm's kernels, which Apex's own
distributed tests and some training code call directly): Welford statistics, their
merge across ranks, the normalization and its backward, channels-first and
channels-last (``*_c_last``: input (N, ..., C)). On core_ops' sync batch norm ops
(Note [Sync batch norm ops] in _schemas.py); statistics in float32 (float64 for
float64 input)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import native
from ..._schemas import op
from ...parallel.sync_batchnorm_function import merge_stats


def _channels_first(input):
    # A channels-last (N, ..., C) tensor seen as (N, C, ...) without a copy: the ops
    # read any strides and return their output in the input's.
    return input.movedim(-1, 1)


def _ops(input):
    native.ensure_for(input.device)
    return op


def welford_mean_var(input):
    """``[mean, biased var]`` per channel of (N, C, ...) ``input``."""
    return list(_ops(input)("sync_batch_norm_stats")(input))


def welford_parallel(mean_feature_nodes, var_biased_feature_nodes, numel, eps):
    """The statistics of the union of ranks from each rank's ``(mean, biased var)``
    rows and its element count ``numel``: ``[mean, biased var, inv_std]``."""
    mean, var, _ = merge_stats(mean_feature_nodes, var_biased_feature_nodes, numel.to(mean_feature_nodes.dtype))
    return [mean, var, torch.rsqrt(var + eps)]


def batchnorm_forward(input, mean, inv_std, weight=None, shift=None):
    return _ops(input)("sync_batch_norm_elemt")(input, mean, inv_std, weight, shift)


def reduce_bn(grad_output, input, mean, inv_std, weight=None):
    """``[sum_dy, sum_dy_xmu, grad_weight, grad_bias]`` (the last two empty without a
    weight), per channel, from this rank's batch."""
    sum_dy, sum_dy_xmu = _ops(input)("sync_batch_norm_backward_reduce")(grad_output, input, mean)
    if weight is None:
        empty = sum_dy.new_empty(0)
        return [sum_dy, sum_dy_xmu, empty, empty.clone()]
    return [sum_dy, sum_dy_xmu, (sum_dy_xmu * inv_std).to(weight.dtype), sum_dy.to(weight.dtype)]


def batchnorm_backward(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count):
    """The input's grad from the global sums and every rank's element ``count``. (Apex's
    API before 2020 took the global means and no count; with ``reduce_bn`` returning
    sums now, a call in the old form fails for the missing ``count`` rather than
    taking sums for means.)"""
    total = count.sum()

    def mean_of(s):  # a sum that is not a floating tensor goes to the op as it is, which names it
        return s / total.to(s.dtype) if isinstance(s, torch.Tensor) and s.is_floating_point() else s
    return _ops(input)("sync_batch_norm_backward_elemt")(grad_output, input, mean, inv_std, weight,
                                                         mean_of(sum_dy), mean_of(sum_dy_xmu))


def welford_mean_var_c_last(input):
    return welford_mean_var(_channels_first(input))


def batchnorm_forward_c_last(input, z, mean, inv_std, weight=None, shift=None, fuse_relu=False):
    """``batchnorm_forward`` of channels-last ``input``, plus ``z`` (a residual), then
    relu if ``fuse_relu``."""
    out = batchnorm_forward(_channels_first(input), mean, inv_std, weight, shift).movedim(1, -1)
    if z is not None:
        out = out + z
    return F.relu(out) if fuse_relu else out


def reduce_bn_c_last(grad_output, input, mean, inv_std, weight=None):
    return reduce_bn(_channels_first(grad_output), _channels_first(input), mean, inv_std, weight)


def batchnorm_backward_c_last(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count):
    return batchnorm_backward(_channels_first(grad_output), _channels_first(input), mean, inv_std, weight,
                              sum_dy, sum_dy_xmu, count).movedim(1, -1)


def relu_bw_c_last(grad_output, input, z, mean, inv_std, weight=None, shift=None):
    """``grad_output`` where the fused forward's output (before relu) was positive."""
    pre = batchnorm_forward(_channels_first(input), mean, inv_std, weight, shift).movedim(1, -1)
    if z is not None:
        pre = pre + z
    return torch.where(pre > 0, grad_output, torch.zeros_like(grad_output))


def __getattr__(name):
    raise AttributeError(f"core_ops' syncbn stand-in has no {name!r}: it provides welford_mean_var, "
                         f"welford_parallel, batchnorm_forward, reduce_bn, batchnorm_backward, their "
                         f"_c_last forms and relu_bw_c_last")
