"""Reference kernel of fused_adagrad_: torch.optim.Adagrad's single-tensor formula (see
csrc/include/core_ops/adagrad_math.h) plus Apex's decoupled adagrad_w_mode."""

from .adam import scaled_grad, step_lr, weights_in_state_dtype, write_back


def fused_adagrad_(params, grads, state_sums, master_params, steps, lr, lr_decay, eps,
                   weight_decay, adagrad_w_mode, maximize, lr_tensor, grad_scale, found_inf):
    lr = step_lr(lr, lr_tensor, found_inf, params)
    if lr is None:
        return
    for i, param in enumerate(params):
        steps[i].add_(1)
        clr = lr / (1 + (steps[i].item() - 1) * lr_decay)
        weights, x = weights_in_state_dtype(param, master_params, i)
        g = scaled_grad(grads[i], x.dtype, grad_scale, maximize)
        if not adagrad_w_mode:
            g = g.add(x, alpha=weight_decay)
        state_sums[i].addcmul_(g, g, value=1)
        std = state_sums[i].sqrt().add_(eps)
        if adagrad_w_mode:
            x.add_((g / std).add_(x, alpha=weight_decay), alpha=-clr)
        else:
            x.addcdiv_(g, std, value=-clr)
        write_back(param, weights, x)


KERNELS = {"fused_adagrad_": fused_adagrad_}
