"""Apex's ``amp_C`` optimizer kernels, with Apex's signatures, on core_ops' fused
optimizer ops (``amp_C`` re-exports them; see its docstring for the conventions).

Apex's kernels kept the state in the param dtype; core_ops' ops keep it in float32,
so half state is computed on float32 copies and written back (one rounding, where
Apex rounded once too). Which kernels honour ``noop_flag`` follows Apex: SGD skips
when it is set; Adam and Adagrad ignore it (Apex's Adam kernel says it wants to
propagate inf/nan).
"""

import torch

from .._library import op
from .applier import tensor_lists_of


def _float_state(states, run):
    """Runs ``run(states)`` with the state lists in float32 (core_ops' ops require
    it), copying the results back into half state lists."""
    if not states[0] or states[0][0].dtype in (torch.float32, torch.float64):
        run(states)
        return
    copies = [[t.float() for t in ts] for ts in states]
    run(copies)
    for ts, cs in zip(states, copies):
        torch._foreach_copy_(ts, cs)


def _steps(params, step):
    # The ops advance their per-tensor counters by one before using them.
    return [torch.full((), float(step) - 1.0, device=p.device) for p in params]


def _value(x):
    return x.item() if isinstance(x, torch.Tensor) else x


def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step, mode,
                      bias_correction, weight_decay):
    """Apex's Adam on ``[grads, params, exp_avgs, exp_avg_sqs]``; ``mode`` 0 is L2
    (decay added to the grad), 1 AdamW (decoupled decay); ``step`` already counts this
    step. ``noop_flag`` is ignored, as in Apex."""
    g, p, m, v = tensor_lists_of(tensor_lists, (4,), "multi_tensor_adam")
    if not p:
        return
    step = int(_value(step))
    _float_state([m, v], lambda s: op("fused_adam_")(
        p, g, s[0], s[1], [], [], _steps(p, step), float(_value(lr)), beta1, beta2, epsilon,
        weight_decay, bool(mode), bool(bias_correction), False, False, None, None, None))


def multi_tensor_sgd(chunk_size, noop_flag, tensor_lists, wd, momentum, dampening, lr, nesterov,
                     first_run, wd_after_momentum, scale):
    """Apex's SGD on ``[grads, params, momentum_buffers]`` or, for half model params
    with float32 masters, ``[half grads, fp32 masters, fp32 momentums, half params]``.
    The grads are multiplied by ``scale`` (Apex passes 1/loss scale); a set
    ``noop_flag`` skips the step, as in Apex."""
    lists = tensor_lists_of(tensor_lists, (3, 4), "multi_tensor_sgd")
    g, p, m = lists[:3]
    if not p:
        return
    if len(lists) == 4:
        params, masters = lists[3], p
    else:
        params, masters = p, []
        g = [x if x.dtype == p[0].dtype else x.to(p[0].dtype) for x in g]
    grad_scale = None if scale == 1.0 else torch.full((), 1.0 / scale, device=g[0].device)
    _float_state([m], lambda s: op("fused_sgd_")(
        params, g, s[0] if momentum else [], masters, float(_value(lr)), momentum, dampening, wd,
        bool(nesterov), bool(wd_after_momentum), bool(first_run), False, None, grad_scale,
        noop_flag))


def multi_tensor_adagrad(chunk_size, noop_flag, tensor_lists, lr, epsilon, mode, weight_decay):
    """Apex's Adagrad on ``[grads, params, state_sums]``; ``mode`` 0 is L2, 1 decoupled
    decay. ``noop_flag`` is ignored, as in Apex."""
    g, p, h = tensor_lists_of(tensor_lists, (3,), "multi_tensor_adagrad")
    if not p:
        return
    _float_state([h], lambda s: op("fused_adagrad_")(
        p, g, s[0], [], _steps(p, 1), float(_value(lr)), 0.0, epsilon, weight_decay, bool(mode),
        False, None, None, None))
