"""Reference kernel of fused_adam_compact_: fused_adam_ (reference/adam.py) with the
compact state of Note [Master remainders] and Note [Blockwise 8-bit moments]
(reference/compact_state.py). Every value is widened to float32, updated by the same
Adam math as fused_adam_, and narrowed back: params rounded to nearest even, bfloat16
moments likewise, 8-bit moments quantized with their blocks' new maxima.
"""

import torch

from .adam import adam_update_, scaled_grad
from .compact_state import dequantize, flat, join_master, quantize, split_master


def load_weights(param, master):
    """The float32 weights the update starts from: the param (itself when float32), its
    fp32 master itself, or the param joined with its int16 remainder (a new tensor)."""
    if master is None:
        return param.float()
    if master.dtype == torch.int16:
        return join_master(param, master)
    return master


def store_weights(param, master, x):
    if master is not None and master.dtype == torch.int16:
        p, r = split_master(x)
        param.copy_(p)
        master.copy_(r)
        return
    if master is not None:
        master.copy_(x)
    param.copy_(x)


def load_moment(state, absmax, qmap, like):
    """A moment as float32, laid out as ``like`` (the param)."""
    out = torch.empty_like(like, dtype=torch.float32)
    if state.dtype == torch.uint8:
        flat(out).copy_(dequantize(flat(state), absmax, qmap))
    else:
        out.copy_(state)
    return out


def store_moment(state, absmax, qmap, value):
    if state.dtype == torch.uint8:
        codes, new_absmax = quantize(flat(value), qmap)
        flat(state).copy_(codes)
        absmax.copy_(new_absmax)
    else:
        state.copy_(value)


def fused_adam_compact_(params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes,
                        master_params, steps, exp_avg_map, exp_avg_sq_map, lr, beta1, beta2, eps,
                        weight_decay, adam_w_mode, bias_correction, maximize, lr_tensor, grad_scale,
                        found_inf):
    if not params or (found_inf is not None and found_inf.item() > 0):
        return
    if lr_tensor is not None:
        lr = lr_tensor.item()
    quantized = exp_avgs[0].dtype == torch.uint8
    for i, param in enumerate(params):
        steps[i].add_(1)
        master = master_params[i] if master_params else None
        m_max = exp_avg_absmaxes[i] if quantized else None
        v_max = exp_avg_sq_absmaxes[i] if quantized else None
        x = load_weights(param, master)
        g = scaled_grad(grads[i], torch.float32, grad_scale, maximize)
        m = load_moment(exp_avgs[i], m_max, exp_avg_map, param)
        v = load_moment(exp_avg_sqs[i], v_max, exp_avg_sq_map, param)
        adam_update_(x, g, m, v, None, steps[i].item(), lr, beta1, beta2, eps, weight_decay,
                     adam_w_mode, bias_correction)
        store_weights(param, master, x)
        store_moment(exp_avgs[i], m_max, exp_avg_map, m)
        store_moment(exp_avg_sqs[i], v_max, exp_avg_sq_map, v)


KERNELS = {"fused_adam_compact_": fused_adam_compact_}
