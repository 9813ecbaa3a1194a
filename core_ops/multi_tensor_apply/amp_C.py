"""Apex's ``amp_C`` extension functions, with Apex's signatures, on core_ops' kernels
(``import amp_C`` under core_ops.compat.apex is this module).

Each takes ``(chunk_size, noop_flag, tensor_lists, *args)``; ``noop_flag`` is Apex's
one-element int32 overflow flag, set to 1 on inf or nan. As in Apex, norms come back
as one-element tensors.

The optimizer kernels (``multi_tensor_adam``, ``_sgd``, ``_adagrad``) run core_ops'
fused optimizer ops. Apex's kernels kept the state in the param dtype; core_ops' ops
keep it in float32, so half state is computed on float32 copies and written back (one
rounding, where Apex rounded once too). Which kernels honour ``noop_flag`` follows
Apex: SGD skips when it is set; Adam and Adagrad ignore it (Apex's Adam kernel says it
wants to propagate inf/nan).

Not here, because no core_ops op computes the same thing: ``multi_tensor_lamb`` and
``multi_tensor_lamb_mp`` (Apex's one-call LAMB clips by a global norm and applies the
trust ratio inside one kernel; use ``core_ops.optimizers.FusedLAMB``),
``multi_tensor_novograd`` (its ``grad_norms`` argument is the blended second moment
Apex's Python computed beforehand), ``multi_tensor_l2norm_scale``, and the two LAMB
stage kernels.
"""

import math

import torch

from .._library import op
from . import ops


def _lists(tensor_lists, depth, name):
    """``tensor_lists`` as lists, checked to be ``depth`` of them (an int, or a tuple of
    the depths allowed)."""
    depths = (depth,) if isinstance(depth, int) else depth
    if not isinstance(tensor_lists, (list, tuple)) or len(tensor_lists) not in depths:
        raise ValueError(f"{name} takes {' or '.join(map(str, depths))} tensor lists, got "
                         f"{len(tensor_lists) if isinstance(tensor_lists, (list, tuple)) else tensor_lists!r}")
    return [list(ts) for ts in tensor_lists]


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    src, dst = _lists(tensor_lists, 2, "multi_tensor_scale")
    ops.multi_tensor_scale(src, dst, scale, found_inf=noop_flag)


def multi_tensor_axpby(chunk_size, noop_flag, tensor_lists, a, b, arg_to_check):
    x, y, out = _lists(tensor_lists, 3, "multi_tensor_axpby")
    ops.multi_tensor_axpby(x, y, out, a, b, found_inf=noop_flag, arg_to_check=arg_to_check)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    (tensors,) = _lists(tensor_lists, 1, "multi_tensor_l2norm")
    total, per = ops.multi_tensor_l2norm(tensors, per_tensor)
    return total.reshape(1), per


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    """Apex's semantics: the norm of ``t * inv_scale``, without writing ``t``."""
    (tensors,) = _lists(tensor_lists, 1, "multi_tensor_unscale_l2norm")
    total, per = ops.multi_tensor_l2norm(tensors, per_tensor)
    if tensors:
        total, per = total * inv_scale, per * inv_scale
    return total.reshape(1), per


def update_scale_hysteresis(current_scale, growth_tracker, hysteresis_tracker, found_inf,
                            growth_factor, backoff_factor, growth_interval, hysteresis):
    ops.update_scale(current_scale, growth_tracker, found_inf, growth_factor=growth_factor,
                     backoff_factor=backoff_factor, growth_interval=growth_interval,
                     hysteresis=hysteresis, hysteresis_tracker=hysteresis_tracker,
                     min_scale=0.0, max_scale=math.inf)
    return current_scale


# Apex's _mp variant takes half inputs and returns float32 norms, which the plain
# one already does here (norms accumulate in float32, Note [Multi-tensor conventions]).
multi_tensor_l2norm_mp = multi_tensor_l2norm


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
    g, p, m, v = _lists(tensor_lists, (4,), "multi_tensor_adam")
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
    lists = _lists(tensor_lists, (3, 4), "multi_tensor_sgd")
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
    g, p, h = _lists(tensor_lists, (3,), "multi_tensor_adagrad")
    if not p:
        return
    _float_state([h], lambda s: op("fused_adagrad_")(
        p, g, s[0], [], _steps(p, 1), float(_value(lr)), 0.0, epsilon, weight_decay, bool(mode),
        False, None, None, None))
