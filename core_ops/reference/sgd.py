"""Reference kernel of fused_sgd_: torch.optim.SGD's single-tensor formula (see
csrc/include/core_ops/sgd_math.h) plus Apex's wd_after_momentum, per tensor."""

import torch

from .adam import scaled_grad, step_lr, weights_in_state_dtype, write_back


def fused_sgd_(params, grads, momentum_buffers, master_params, lr, momentum, dampening,
               weight_decay, nesterov, wd_after_momentum, first_step, maximize, lr_tensor,
               grad_scale, found_inf):
    lr = step_lr(lr, lr_tensor, found_inf, params)
    if lr is None:
        return
    for i, param in enumerate(params):
        weights, x = weights_in_state_dtype(param, master_params, i)
        r = _rounding(param, master_params)
        d = r(scaled_grad(grads[i], x.dtype, grad_scale, maximize))
        if weight_decay and not wd_after_momentum:
            d = r(d.add(x, alpha=weight_decay))
        if momentum:
            buf = momentum_buffers[i]
            if first_step:
                buf.copy_(d)
            else:
                buf.copy_(r(r(buf * momentum).add_(d, alpha=1 - dampening)))
            d = r(d.add(buf, alpha=momentum)) if nesterov else buf
        if weight_decay and wd_after_momentum:
            d = r(d.add(x, alpha=weight_decay))
        x.add_(d, alpha=-lr)
        write_back(param, weights, x)


def _rounding(param, master_params):
    """Each op's result rounded to a half param's dtype when it steps without masters,
    as torch.optim rounds on half tensors (Note [Half params without masters] in
    csrc/include/core_ops/primitives.h); no rounding otherwise."""
    if master_params or param.dtype not in (torch.float16, torch.bfloat16):
        return lambda t: t
    return lambda t: t.to(param.dtype).to(t.dtype)


KERNELS = {"fused_sgd_": fused_sgd_}
