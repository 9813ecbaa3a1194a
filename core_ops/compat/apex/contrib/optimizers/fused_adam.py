"""Apex's ``contrib.optimizers.FusedAdam`` (the pre-amp one, fairseq's ``FusedAdamV1``):
Adam with Apex's old formula (see ``fused_adam_cuda``), and a ``step`` that can take
the grads and a reduced-precision copy of the params from outside, with a scale that
divides the grads: ``step(grads=..., output_params=..., scale=..., grad_norms=...)``,
as contrib's ``FP16_Optimizer`` calls it. ``max_grad_norm`` > 0 clips by the given
grad norms."""

from __future__ import annotations

import torch

from ....._validate import SparseGradError
from ....apex_extensions import fused_adam_cuda
from ._grouped import per_group


class FusedAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0.0, max_grad_norm=0.0, amsgrad=False, use_mt=False,
                 amp_scale_adjustment=1.0):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        self._use_multi_tensor = bool(use_mt)  # the same arithmetic either way
        self._amp_scale_adjustment = amp_scale_adjustment
        self.eps_mode = 0 if eps_inside_sqrt else 1
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None, grads=None, output_params=None, scale=1.0, grad_norms=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        n = len(self.param_groups)
        grads = per_group(grads, n, "FusedAdam.step(grads=)")
        outputs = per_group(output_params, n, "FusedAdam.step(output_params=)")
        norms = [None] * n if grad_norms is None else list(grad_norms)
        for group, group_grads, group_outputs, norm in zip(self.param_groups, grads, outputs, norms):
            combined_scale = scale
            if group["max_grad_norm"] > 0 and norm is not None:
                # The grads' norm is that of the scaled grads: clip the unscaled ones.
                clip = ((float(norm) / scale) + 1e-6) / group["max_grad_norm"]
                if clip > 1:
                    combined_scale = clip * scale
            beta1, beta2 = group["betas"]
            params = group["params"]
            group_grads = group_grads or [None] * len(params)
            group_outputs = group_outputs or [None] * len(params)
            for p, grad, out in zip(params, group_grads, group_outputs, strict=True):
                if grad is None:
                    if p.grad is None:
                        continue
                    grad = p.grad
                if grad.is_sparse:
                    raise SparseGradError("FusedAdam does not support sparse gradients, please consider "
                                          "SparseAdam instead")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                fused_adam_cuda.adam(p, p.new_empty(0) if out is None else out, state["exp_avg"],
                                     state["exp_avg_sq"], grad, group["lr"], beta1, beta2, group["eps"],
                                     combined_scale, state["step"], self.eps_mode,
                                     1 if group["bias_correction"] else 0, group["weight_decay"])
        return loss
