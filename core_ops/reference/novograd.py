"""Reference kernel of fused_novograd_: NovoGrad as csrc/include/core_ops/novograd_math.h
writes it (Apex's semantics), operation for operation (each * and + rounded apart, no
FMA-prone ``add(alpha=)`` / ``addcmul``), so the native CPU kernel agrees with it to the
last bit or so. The per-tensor scalars are Python floats (double), rounded once, as there."""

import math

import torch

from .adam import _sqrt, divide, power, scaled_grad, step_lr, weights_in_state_dtype, write_back


def fused_novograd_(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, grad_norms, norm_type,
                    lr, beta1, beta2, eps, weight_decay, bias_correction, reg_inside_moment,
                    grad_averaging, init_zero, maximize, lr_tensor, grad_scale, found_inf):
    lr = step_lr(lr, lr_tensor, found_inf, params)
    if lr is None:
        return
    scale = grad_scale.item() if grad_scale is not None else 1.0
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    for i, param in enumerate(params):
        steps[i].add_(1)
        step = steps[i].item()
        m, v = exp_avgs[i], exp_avg_sqs[i]
        n = grad_norms[i].item() / scale
        x = n if norm_type == 0 else n * n  # max|g| is averaged itself, the L2 norm squared
        fresh = step == 1 and not init_zero
        v.fill_(x if fresh else beta2 * v.item() + (1.0 - beta2) * x)
        bc1 = 1.0 - power(beta1, step) if bias_correction else 1.0
        bc2 = 1.0 - power(beta2, step) if bias_correction else 1.0
        layer_norm = v.item() if norm_type == 0 else _sqrt(v.item())
        # 0-d tensors, not Python floats: torch would turn some scalar divisions into
        # multiplications by the reciprocal, the kernel divides.
        denom = torch.tensor(divide(layer_norm, _sqrt(bc2)) + eps, dtype=m.dtype, device=m.device)
        bc1 = torch.tensor(bc1, dtype=m.dtype, device=m.device)
        weights, p = weights_in_state_dtype(param, master_params, i)
        g = scaled_grad(grads[i], m.dtype, grad_scale, maximize)
        if reg_inside_moment:
            m.copy_(m * beta1 + (g / denom + p * weight_decay) * beta3)
            update = m / bc1
        else:
            m.copy_(m * beta1 + g * beta3)
            update = m / bc1 / denom + p * weight_decay
        p.copy_(p + update * -lr)
        write_back(param, weights, p)


KERNELS = {"fused_novograd_": fused_novograd_}
