"""The autograd Function of SyncBatchNorm: per-rank statistics by the core_ops ops
(Note [Sync batch norm ops] in _schemas.py), merged across the process group.

Forward: one all-gather of (mean, biased var, count) per rank and an exact
count-weighted merge, so ranks with unequal (even empty) batches normalise with the
statistics of the concatenated global batch. Backward: one all-reduce of the two
per-channel sums (sum dy, sum dy * (x - mean)).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import native
from .._schemas import op
from ._groups import all_gather_flat, world_size


# The "group" of a forward that must not communicate (eval mode: torch.nn.SyncBatchNorm
# syncs only in training, so ranks may evaluate alone).
LOCAL = object()


def merge_stats(means, variances, counts):
    """Mean and biased variance of the union of groups from each group's (mean, biased
    variance, count): Chan et al.'s parallel formula, which is exact (up to rounding)
    for any counts, zero included. means / variances are (world, C), counts (world,)."""
    total = counts.sum()
    weights = (counts / total.clamp(min=1)).unsqueeze(1)
    mean = (weights * means).sum(0)
    # Each group's spread around the global mean: its own variance plus the squared
    # distance of its mean; summing (x - mean)^2 terms never subtracts large numbers.
    var = (weights * (variances + (means - mean) ** 2)).sum(0)
    return mean, var, total


def local_and_global_stats(input, group):
    """(mean, biased var, global count) of the batch over every rank of ``group``. The
    count is a Python int when the group is this process alone (known on the host:
    each op on it would be a kernel launch on a GPU), else a 0-d tensor."""
    native.ensure_for(input.device)
    mean, var = op("sync_batch_norm_stats")(input)
    count = input.numel() // input.shape[1] if input.shape[1] else 0
    if group is LOCAL or world_size(group) == 1:
        return mean, var, count
    local = torch.cat([mean, var, mean.new_full((1,), float(count))])
    gathered = all_gather_flat(local, group)
    channels = mean.numel()
    return merge_stats(gathered[:, :channels], gathered[:, channels:2 * channels],
                       gathered[:, 2 * channels])


def update_running_stats(running_mean, running_var, mean, var, count, factor):
    """Moves the running stats ``factor`` of the way to this batch's, in one foreach op.
    The running variance is the unbiased estimate over the global batch (torch's
    BatchNorm); a count on the device stays there, so the host never waits for it. An
    empty global batch has no statistics and leaves them as they are (torch's BatchNorm)."""
    if isinstance(count, torch.Tensor):
        unbiased = var * (count / (count - 1).clamp(min=1))
        weight = (count > 0).to(running_mean.dtype) * factor  # 0 for an empty batch
        weight = [weight, weight]
    elif count > 0:
        unbiased, weight = var * (count / max(count - 1, 1)), factor
    else:
        return
    torch._foreach_lerp_([running_mean, running_var],
                         [mean.to(running_mean.dtype), unbiased.to(running_var.dtype)], weight)


class SyncBatchNormFunction(torch.autograd.Function):
    """forward(input (N, C, *), weight, bias, running_mean, running_var, eps,
    exponential_average_factor, group, sync) -> output; running stats updated in place.
    ``sync=False`` normalises with this process's batch alone (no communication).

    Note [SyncBN double backward]: the backward's native ops have no derivatives of
    their own. Under ``create_graph=True`` (a gradient penalty, a Hessian-vector
    product) a process-local batch takes torch's own batch norm backward instead, so
    a second backward is exact; across processes it raises (torch.nn.SyncBatchNorm
    cannot do it either) rather than returning zeros."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, factor, group, sync=True):
        group = group if sync else LOCAL
        mean, var, count = local_and_global_stats(input, group)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            update_running_stats(running_mean, running_var, mean, var, count, factor)
        out = op("sync_batch_norm_elemt")(input, mean, invstd, weight, bias)
        if isinstance(count, torch.Tensor):
            ctx.save_for_backward(input, weight, mean, invstd, count)
        else:
            ctx.save_for_backward(input, weight, mean, invstd)
            ctx.count = count
        ctx.group = group
        ctx.has_bias = bias is not None
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if torch.is_grad_enabled():  # create_graph=True: Note [SyncBN double backward]
            return differentiable_backward(ctx, grad_out)
        input, weight, mean, invstd, *count = ctx.saved_tensors
        count = count[0] if count else max(ctx.count, 1)
        grad_out = grad_out if grad_out.dtype == input.dtype else grad_out.to(input.dtype)
        sum_dy, sum_dy_xmu = op("sync_batch_norm_backward_reduce")(grad_out, input, mean)
        grad_weight = grad_bias = grad_input = None
        # Weight and bias get this rank's share only: DistributedDataParallel (or the
        # user) reduces parameter gradients like any other.
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(weight.dtype if weight is not None else input.dtype)
        # Every rank joins the all-reduce, even one whose input needs no grad: whether
        # it does is each rank's own business, the collective is the group's.
        sums = None
        if ctx.group is not LOCAL and world_size(ctx.group) > 1:
            sums = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(sums, group=ctx.group)
        if ctx.needs_input_grad[0]:
            sums = torch.cat([sum_dy, sum_dy_xmu]) if sums is None else sums
            sums = sums / (count.clamp(min=1) if isinstance(count, torch.Tensor) else count)
            channels = mean.numel()
            grad_input = op("sync_batch_norm_backward_elemt")(
                grad_out, input, mean, invstd, weight, sums[:channels], sums[channels:])
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


def differentiable_backward(ctx, grad_out):
    """The first-order grads as a graph of torch ops (Note [SyncBN double backward]):
    torch's batch norm on the saved input, with this batch's statistics."""
    if ctx.group is not LOCAL and world_size(ctx.group) > 1:
        raise RuntimeError("SyncBatchNorm: backward with create_graph=True (a double backward, "
                           "e.g. a gradient penalty) is not supported across processes; use "
                           "BatchNorm in that model, or a process group of one")
    input, weight = ctx.saved_tensors[:2]
    bias = torch.zeros_like(weight, requires_grad=True) if ctx.has_bias else None
    wanted = [t for t, needed in zip((input, weight, bias), ctx.needs_input_grad[:3]) if needed]
    out = F.batch_norm(input, None, None, weight, bias, True, 0.0, ctx.eps)
    grads = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=True))
    return tuple(next(grads) if needed else None for needed in ctx.needs_input_grad)
