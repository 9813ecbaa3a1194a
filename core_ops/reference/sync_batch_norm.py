"""Reference kernels of the sync batch-norm ops (Note [Sync batch norm ops] in
_schemas.py): the per-rank statistics and the elementwise pieces, in the accumulation
dtype (float32, float64 for float64 input), written with plain torch ops."""

import torch

from .._validate import batch_norm_acc_dtype, check_batch_norm_args


def _reduced_dims(input):
    return [d for d in range(input.dim()) if d != 1]


def _channel(t, input):
    """A (C,) tensor shaped to broadcast against (N, C, *) input."""
    return t.view((1, -1) + (1,) * (input.dim() - 2))


def _like_input(value, input):
    """``value`` in input's dtype and strides, as the fake kernel promises."""
    out = torch.empty_like(input)
    out.copy_(value)
    return out


def sync_batch_norm_stats(input):
    check_batch_norm_args(input)
    acc = batch_norm_acc_dtype(input.dtype)
    channels = input.shape[1]
    if input.numel() == 0:  # an empty batch: zeros, which the count-weighted merge ignores
        zeros = input.new_zeros((channels,), dtype=acc)
        return zeros, zeros.clone()
    var, mean = torch.var_mean(input.to(acc), dim=_reduced_dims(input), correction=0)
    return mean, var


def sync_batch_norm_elemt(input, mean, invstd, weight, bias):
    check_batch_norm_args(input, stats=(("mean", mean), ("invstd", invstd)), weight=weight, bias=bias)
    acc = mean.dtype
    # Grouped as csrc/include/core_ops/welford_math.h: (x - mean) * (invstd * weight) + bias.
    scale = invstd if weight is None else invstd * weight.to(acc)
    y = (input.to(acc) - _channel(mean, input)) * _channel(scale, input)
    if bias is not None:
        y = y + _channel(bias.to(acc), input)
    return _like_input(y, input)


def sync_batch_norm_backward_reduce(grad_out, input, mean):
    check_batch_norm_args(input, grad_out=grad_out, stats=(("mean", mean),))
    acc, dims = mean.dtype, _reduced_dims(input)
    dy = grad_out.to(acc)
    if input.numel() == 0:
        return mean.new_zeros(mean.shape), mean.new_zeros(mean.shape)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (input.to(acc) - _channel(mean, input))).sum(dims)
    return sum_dy, sum_dy_xmu


def sync_batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, mean_dy, mean_dy_xmu):
    check_batch_norm_args(input, grad_out=grad_out, weight=weight, stats=(
        ("mean", mean), ("invstd", invstd), ("mean_dy", mean_dy), ("mean_dy_xmu", mean_dy_xmu)))
    acc = mean.dtype
    xmu = input.to(acc) - _channel(mean, input)
    scale = invstd if weight is None else invstd * weight.to(acc)
    dx = (grad_out.to(acc) - _channel(mean_dy, input)
          - xmu * _channel(invstd * invstd * mean_dy_xmu, input)) * _channel(scale, input)
    return _like_input(dx, input)


KERNELS = {
    "sync_batch_norm_stats": sync_batch_norm_stats,
    "sync_batch_norm_elemt": sync_batch_norm_elemt,
    "sync_batch_norm_backward_reduce": sync_batch_norm_backward_reduce,
    "sync_batch_norm_backward_elemt": sync_batch_norm_backward_elemt,
}
