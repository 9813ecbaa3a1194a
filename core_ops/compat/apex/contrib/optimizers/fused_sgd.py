"""Apex's ``contrib.optimizers.FusedSGD``: SGD on float32 masters, only under contrib's
``FP16_Optimizer``, which passes the (half or float32) model grads and the model params
to write back: ``step(grads=..., output_params=..., scale=...)``. The update is
``amp_C.multi_tensor_sgd`` (core_ops' fused SGD) with the grads divided by ``scale``."""

from __future__ import annotations

import torch
from torch.optim.optimizer import required

from ....apex_extensions import amp_C
from ._grouped import per_group


class FusedSGD(torch.optim.Optimizer):
    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 wd_after_momentum=False, materialize_master_grads=True):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))
        self.wd_after_momentum = wd_after_momentum
        self._dummy_overflow_buf = torch.zeros(1, dtype=torch.int32)

    def _momentums(self, params):
        """The momentum buffers, created at zero on the first step, and whether this
        is that step (the kernel then takes the grad as the momentum, as torch does)."""
        first = False
        buffers = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                first = True
                state["momentum_buffer"] = torch.zeros_like(p)
            buffers.append(state["momentum_buffer"])
        return buffers, first

    @torch.no_grad()
    def step(self, closure=None, grads=None, output_params=None, scale=1.0, grad_norms=None):
        if grads is None or output_params is None:
            raise RuntimeError("apex.contrib.optimizers.FusedSGD must be wrapped with "
                               "apex.contrib.optimizers.FP16_Optimizer, which provides grads and output_params")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        n = len(self.param_groups)
        for group, group_grads, models in zip(self.param_groups, per_group(grads, n, "FusedSGD.step(grads=)"),
                                              per_group(output_params, n, "FusedSGD.step(output_params=)")):
            if group_grads is None or models is None or any(g is None for g in group_grads):
                raise RuntimeError("apex.contrib.optimizers.FusedSGD only works when all parameters require grad")
            masters = group["params"]
            for half in (True, False):  # half models write back a copy; float32 ones are the masters
                picked = [i for i, m in enumerate(models) if (m.dtype != torch.float32) == half]
                if not picked:
                    continue
                fp32 = [masters[i] for i in picked]
                momentums, first = self._momentums(fp32)
                lists = [[group_grads[i] for i in picked], fp32, momentums]
                if half:
                    lists.append([models[i] for i in picked])
                amp_C.multi_tensor_sgd(2048 * 32, self._dummy_overflow_buf, lists, group["weight_decay"],
                                       group["momentum"], group["dampening"], group["lr"], group["nesterov"],
                                       first, self.wd_after_momentum, 1.0 / scale)
        return loss
