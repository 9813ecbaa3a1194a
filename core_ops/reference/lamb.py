"""Reference kernels of fused_lamb_stage1_ / fused_lamb_stage2_ (the formulas of
csrc/include/core_ops/lamb_math.h, per tensor, in the state dtype)."""

from .adam import power, scaled_grad, step_lr, weights_in_state_dtype, write_back


def fused_lamb_stage1_(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, updates, beta1,
                       beta2, eps, weight_decay, adam_w_mode, bias_correction, grad_averaging,
                       maximize, grad_scale, found_inf):
    if not params or (found_inf is not None and found_inf.item() > 0):  # an empty call reads nothing
        return
    beta3 = 1 - beta1 if grad_averaging else 1.0
    for i, param in enumerate(params):
        steps[i].add_(1)
        step = steps[i].item()
        bc1 = 1 - power(beta1, step) if bias_correction else 1.0
        bc2 = 1 - power(beta2, step) if bias_correction else 1.0
        _, x = weights_in_state_dtype(param, master_params, i)
        m, v = exp_avgs[i], exp_avg_sqs[i]
        g = scaled_grad(grads[i], m.dtype, grad_scale, maximize)
        if not adam_w_mode:
            g = g + weight_decay * x
        m.mul_(beta1).add_(beta3 * g)
        v.mul_(beta2).add_((1 - beta2) * g * g)
        u = (m / bc1) / ((v / bc2).sqrt() + eps)
        if adam_w_mode:
            u = u + weight_decay * x
        updates[i].copy_(u)


def fused_lamb_stage2_(params, master_params, updates, param_norms, update_norms, lr, weight_decay,
                       use_nvlamb, lr_tensor, found_inf):
    lr = step_lr(lr, lr_tensor, found_inf, params)
    if lr is None:
        return
    for i, param in enumerate(params):
        pn, un = param_norms[i].item(), update_norms[i].item()
        ratio = pn / un if (use_nvlamb or weight_decay != 0) and pn > 0 and un > 0 else 1.0
        weights, x = weights_in_state_dtype(param, master_params, i)
        x.add_(updates[i], alpha=-lr * ratio)
        write_back(param, weights, x)


KERNELS = {"fused_lamb_stage1_": fused_lamb_stage1_, "fused_lamb_stage2_": fused_lamb_stage2_}
