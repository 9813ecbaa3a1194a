"""Turning a model's BatchNorms into SyncBatchNorms, and groups for them."""

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from ._groups import require_initialized
from .sync_batchnorm import SyncBatchNorm


def convert_syncbn_model(module, process_group=None, channel_last=False):
    """Returns ``module`` with every ``_BatchNorm`` (BatchNorm1d/2d/3d, torch's
    SyncBatchNorm, ...) replaced, recursively, by a :class:`SyncBatchNorm` holding the
    same weights, running stats and training flag. Apex's function; ``module`` itself
    is returned converted when it is a batch norm."""
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        converted = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats, process_group, channel_last)
        with torch.no_grad():
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            if module.track_running_stats:
                converted.running_mean = module.running_mean
                converted.running_var = module.running_var
                converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
        converted._core_ops_reverts_to = type(module)  # for revert_syncbn_model
        if hasattr(module, "qconfig"):  # quantization-aware training config, as torch keeps it
            converted.qconfig = module.qconfig
        if module.affine:
            converted.to(module.weight.device)
        return converted
    for name, child in module.named_children():
        new = convert_syncbn_model(child, process_group, channel_last)
        if new is not child:
            setattr(module, name, new)
    return module


class BatchNormAnyDim(_BatchNorm):
    """A plain batch norm of any input rank >= 2: what a SyncBatchNorm that was not
    converted from another batch norm reverts to (as Lightning's own revert does)."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions (N, C, ...), got {input.dim()}")


def revert_syncbn_model(module):
    """The inverse of ``convert_syncbn_model``: every core_ops ``SyncBatchNorm`` back to
    the batch norm class it was converted from (``BatchNormAnyDim`` if it was built
    directly), sharing its weights, running stats and training flag. Lightning's
    strategies call it at the end of ``fit``."""
    if isinstance(module, SyncBatchNorm):
        cls = getattr(module, "_core_ops_reverts_to", BatchNormAnyDim)
        plain = cls(module.num_features, module.eps, module.momentum, module.affine,
                    module.track_running_stats)
        if module.affine:
            plain.weight, plain.bias = module.weight, module.bias
        if module.track_running_stats:
            plain.running_mean, plain.running_var = module.running_mean, module.running_var
            plain.num_batches_tracked = module.num_batches_tracked
        plain.train(module.training)
        return plain
    for name, child in module.named_children():
        new = revert_syncbn_model(child)
        if new is not child:
            setattr(module, name, new)
    return module


def create_syncbn_process_group(group_size):
    """Splits the world into consecutive groups of ``group_size`` ranks and returns the
    group of this rank (Apex's function): SyncBatchNorm then syncs within that group.
    Every rank must call it (creating groups is collective). ``group_size`` 0 or the
    world size means the whole world (returns None, the default group)."""
    require_initialized("create_syncbn_process_group")
    world = dist.get_world_size()
    if not isinstance(group_size, int) or group_size < 0:
        raise ValueError(f"group_size must be a non-negative integer, got {group_size!r}")
    if group_size == 0 or group_size == world:
        return None
    if world % group_size != 0:
        raise ValueError(f"group_size {group_size} does not divide the world size {world}")
    rank, mine = dist.get_rank(), None
    for start in range(0, world, group_size):
        group = dist.new_group(list(range(start, start + group_size)))
        if start <= rank < start + group_size:
            mine = group
    return mine
