"""Reference kernel of fused_adam_ (Note [Fused optimizer ops] in _schemas.py).

torch.optim.Adam's single-tensor formula (Note [Adam as torch.optim computes it] in
csrc/include/core_ops/adam_math.h), per tensor, in the state dtype. It reads
found_inf, lr_tensor and steps on the host: the reference is the specification and
the fallback, not the fast path.
"""

import math

import torch

from .._validate import state_dtype


def weights_in_state_dtype(param, master_params, i):
    """(the tensor the update lands in, a state-dtype tensor to compute on): the
    master copy itself, the fp32 param itself, or a float copy of a half param."""
    weights = master_params[i] if master_params else param
    want = state_dtype(param.dtype)
    return weights, weights if weights.dtype == want else weights.to(want)


def scaled_grad(grad, dtype, grad_scale, maximize):
    """The grad the update reads, in ``dtype``: divided by ``grad_scale`` (then written
    back into ``grad``, Note [Grads written back unscaled] in
    csrc/include/core_ops/optimizer_args.h) and negated for maximize."""
    g = grad.to(dtype)
    if grad_scale is not None:
        g = g / grad_scale.to(dtype)
        grad.copy_(g)
    return -g if maximize else g


def step_lr(lr, lr_tensor, found_inf, params=True):
    """The lr this step uses (``lr_tensor``'s when given, read on the host), or None when
    ``found_inf`` says the step is skipped or there are no ``params`` (an empty call
    reads nothing, as the kernels)."""
    if not params:
        return None
    if found_inf is not None and found_inf.item() > 0:
        return None
    return lr if lr_tensor is None else lr_tensor.item()


def power(base, exponent):
    """base ** exponent as C's pow: inf past float64's range (a beta of 1e30), not an
    OverflowError."""
    try:
        return base ** exponent
    except OverflowError:
        return math.copysign(math.inf, base) if exponent % 2 else math.inf


def divide(a, b):
    """a / b as C's double division: +-inf or nan for b == 0 (a beta of -1 makes a bias
    correction 0), not a ZeroDivisionError."""
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _sqrt(x):
    """math.sqrt as C's sqrt: nan for a negative (a beta > 1), not an error."""
    return math.sqrt(x) if x >= 0 else float("nan")


def write_back(param, weights, x):
    if x is not weights:
        weights.copy_(x)
    if weights is not param:
        param.copy_(weights)


def fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps,
                lr, beta1, beta2, eps, weight_decay, adam_w_mode, bias_correction, amsgrad,
                maximize, lr_tensor, grad_scale, found_inf):
    lr = step_lr(lr, lr_tensor, found_inf, params)
    if lr is None:
        return
    for i, param in enumerate(params):
        steps[i].add_(1)
        weights, x = weights_in_state_dtype(param, master_params, i)
        g = scaled_grad(grads[i], exp_avgs[i].dtype, grad_scale, maximize)
        adam_update_(x, g, exp_avgs[i], exp_avg_sqs[i], max_exp_avg_sqs[i] if amsgrad else None,
                     steps[i].item(), lr, beta1, beta2, eps, weight_decay, adam_w_mode, bias_correction)
        write_back(param, weights, x)


def correctly_rounded_sqrt(t):
    """sqrt rounded once, as the kernels' sqrtf / vector sqrt instructions: torch's CPU
    float32 sqrt is off by an ulp for some inputs (its vector math library's), so float32
    goes through float64 (whose sqrt, rounded to float32, is exact)."""
    return t.double().sqrt().to(t.dtype) if t.dtype == torch.float32 else t.sqrt()


def adam_update_(x, g, m, v, vmax, step, lr, beta1, beta2, eps, weight_decay, adam_w_mode,
                 bias_correction):
    """One Adam / AdamW update of weights ``x`` and moments ``m``, ``v`` (and ``vmax``
    for amsgrad, else None), in place, all in one dtype, at step count ``step``.

    torch.optim.Adam's single-tensor formula, written as separate ops in the order of
    csrc/include/core_ops/adam_math.h, each rounded once (torch's lerp_, addcmul_ and
    addcdiv_ may fuse a multiply-add or associate otherwise), so that native kernels
    and this agree bit for bit."""
    if adam_w_mode:
        x.mul_(1 - lr * weight_decay)
    else:
        g = g.add(x.mul(weight_decay))
    m.add_((g - m).mul_(1 - beta1))  # lerp, weight 1 - beta1 < 0.5
    v.mul_(beta2).add_(g.mul(1 - beta2).mul_(g))
    bc1 = 1 - power(beta1, step) if bias_correction else 1.0
    bc2_sqrt = _sqrt(1 - power(beta2, step)) if bias_correction else 1.0
    second = v
    if vmax is not None:
        vmax.copy_(vmax.maximum(v))
        second = vmax
    denom = correctly_rounded_sqrt(second).div_(bc2_sqrt).add_(eps)
    x.add_(m.mul(-divide(lr, bc1)).div_(denom))


KERNELS = {"fused_adam_": fused_adam_}
