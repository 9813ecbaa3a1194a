"""Reducer: Apex's manual allreduce of a module's (or a list's) gradients."""

import torch
import torch.distributed as dist
from torch import nn

from ._groups import global_src, require_initialized
from .._flat_collectives import flat_all_reduce, flat_broadcast


class Reducer:
    """``Reducer(module_or_grads_list, process_group=None)``; ``reduce()`` averages
    across the group, in place, one flat allreduce per (device, dtype).

    Given a module, its params (and buffers) are broadcast from the group's rank 0 at
    construction, as in Apex, and ``reduce()`` averages the grads of its params that
    require grad; a param with no grad on a rank counts as zeros there, so every rank
    issues the same collectives and ends with the same grads, and a param no rank used
    keeps ``grad=None``. Given a list of tensors,
    ``reduce()`` averages those tensors."""

    def __init__(self, module_or_grads_list, process_group=None):
        require_initialized("Reducer")
        self.process_group = process_group
        if isinstance(module_or_grads_list, nn.Module):
            self.module, self.grads = module_or_grads_list, None
            tensors = list(self.module.parameters()) + list(self.module.buffers())
            if tensors:
                with torch.no_grad():
                    flat_broadcast([t.data for t in tensors], process_group, global_src(process_group))
        else:
            grads = list(module_or_grads_list)
            if not grads or not all(isinstance(g, torch.Tensor) for g in grads):
                raise TypeError("module_or_grads_list must be a torch.nn.Module or a non-empty "
                                "list of tensors")
            self.module, self.grads = None, grads

    def reduce(self):
        scale = 1.0 / dist.get_world_size(self.process_group)
        if self.grads is not None:
            flat_all_reduce(self.grads, self.process_group, scale)
            return
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            return
        missing = [p.grad is None for p in params]
        for p, absent in zip(params, missing):
            if absent:
                p.grad = torch.zeros_like(p)
        # One "used" flag per param rides along in the first grad's flat buffer (its
        # dtype: counts up to the world size are exact even in bf16 / fp16, so no
        # second collective): a param no rank used keeps grad None, as in
        # DistributedDataParallel, so optimizers skip it instead of decaying it.
        used = torch.tensor([0.0 if absent else 1.0 for absent in missing],
                            dtype=params[0].grad.dtype, device=params[0].grad.device)
        flat_all_reduce([p.grad for p in params] + [used], self.process_group, scale)
        if any(missing):  # one host read, only on a rank that lacked some grads
            for p, absent, anyone in zip(params, missing, used.tolist()):
                if absent and anyone == 0:
                    p.grad = None
