"""SyncBatchNorm: batch norm whose training statistics cover the whole process group.

Unlike torch.nn.SyncBatchNorm it runs on CPU (gloo) as on CUDA (NCCL), needs no
initialized process group outside training, and accepts Apex's ``channel_last``.
"""

import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ._groups import world_size
from .sync_batchnorm_function import SyncBatchNormFunction


class SyncBatchNorm(_BatchNorm):
    """Apex's ``SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True, process_group=None, channel_last=False, fuse_relu=False)``.

    Input is (N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W), in any memory format
    (torch's channels_last included); with ``channel_last=True`` the channels are the
    last dimension instead, (N, ..., C), as in Apex. In training (or without running
    stats) each rank computes per-channel mean and variance of its own batch
    (Welford), the ranks of ``process_group`` (default: all) exchange
    (mean, var, count) in one all-gather and merge them weighted by count, so unequal
    or empty per-rank batches give exactly the statistics of the concatenated batch.
    Running stats take the unbiased variance; ``momentum=None`` keeps a cumulative
    average. In eval mode nothing is communicated: the running stats are used, or
    without them (``track_running_stats=False``) each rank's own batch statistics, as
    in torch.nn.SyncBatchNorm. An empty global batch leaves the running stats as they
    are. Differentiable once (a double backward raises, as torch's does).

    As Apex's optimized SyncBatchNorm, ``forward(input, z=None)`` returns
    ``bn(input) + z`` when ``z`` (of the input's shape and layout) is given, passed
    through a ReLU when ``fuse_relu=True``: a residual block's add and activation.

    A subclass of torch's ``_BatchNorm``: its state dict is a BatchNorm's, both ways.
    """

    fuse_relu = False  # the default of a module pickled before the option existed

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, channel_last=False,
                 fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu

    def _specify_process_group(self, process_group):
        """Apex's setter: the group whose ranks share the batch statistics (None: all)."""
        self.process_group = process_group

    def _check_input_dim(self, input):
        if not 2 <= input.dim() <= 5:
            raise ValueError(f"SyncBatchNorm: expected 2D to 5D input (N, C, ...), got "
                             f"{input.dim()}D input of shape {tuple(input.shape)}")
        channels = input.shape[-1] if self.channel_last else input.shape[1]
        if channels != self.num_features:
            where = "last" if self.channel_last else "second (channel)"
            raise ValueError(f"SyncBatchNorm: input has {channels} features in its {where} "
                             f"dimension but num_features is {self.num_features}")

    def _average_factor(self):
        """The weight of this batch in the running stats, counting the batch as torch's
        _BatchNorm does (momentum None: cumulative average)."""
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, input, z=None):
        out = self._normalize(input)
        if z is not None:
            if z.shape != out.shape:
                raise ValueError(f"SyncBatchNorm: z must have the input's shape {tuple(out.shape)} "
                                 f"(it is added to the output), got {tuple(z.shape)}")
            out = out + z
        return F.relu(out) if self.fuse_relu else out

    def _normalize(self, input):
        self._check_input_dim(input)
        # Apex's channel_last (N, ..., C) is viewed as (N, C, ...) with channels-last
        # strides: no copy, and the kernels read channels-last memory in place.
        x = input.movedim(-1, 1) if self.channel_last else input
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            out = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                               False, 0.0, self.eps)
        else:
            group = self.process_group
            if world_size(group) == 1 and x.numel() == x.shape[1] and self.training:
                raise ValueError("SyncBatchNorm: expected more than 1 value per channel when "
                                 f"training, got input of shape {tuple(input.shape)}")
            factor = self._average_factor()
            # Batch statistics in eval mode (track_running_stats=False) are this rank's
            # own: as in torch.nn.SyncBatchNorm, only training syncs, so a rank may
            # evaluate alone without waiting for the others.
            out = SyncBatchNormFunction.apply(
                x, self.weight, self.bias,
                self.running_mean if self.training else None,
                self.running_var if self.training else None,
                self.eps, factor, group, self.training)
        return out.movedim(1, -1) if self.channel_last else out

    def extra_repr(self):
        return (super().extra_repr()
                + f", channel_last={self.channel_last}, fuse_relu={self.fuse_relu}")
