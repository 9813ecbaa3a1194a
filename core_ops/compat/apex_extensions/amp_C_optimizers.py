"""Apex's ``amp_C`` optimizer kernels, with Apex's signatures, on core_ops' fused
optimizer ops (``amp_C`` re-exports them; see its docstring for the conventions).

Apex's kernels kept the state in the param dtype; core_ops' ops keep it in float32,
so half state is computed on float32 copies and written back (one rounding, where
Apex rounded once too). Which kernels honour ``noop_flag`` follows Apex: SGD skips
when it is set; Adam and Adagrad ignore it (Apex's Adam kernel says it wants to
propagate inf/nan). A kernel given a grad scale writes the unscaled grads back, as
Apex's capturable Adam did (Note [Grads written back unscaled]).
"""

import torch

from ..._schemas import op
from ..._validate import dense, lr_arg, same_layout, same_length, state_dtype
from ...multi_tensor_apply import ops
from ._args import tensor_lists_of


def _float_state(states, run, weights):
    """Runs ``run(states)`` with the state lists in float32 (core_ops' ops require
    it), copying the results back into half state lists: Apex kept the state of half
    ``weights`` in their dtype. State of any other kind (a float32 tensor among half
    ones, another half dtype, an integer or sparse one) goes to the op as it is,
    which names what is wrong."""
    dtype = weights[0].dtype if weights else None
    if not states[0] or not all(_half_dense(t) and t.dtype == dtype for ts in states for t in ts):
        run(states)
        return
    copies = [[t.float() for t in ts] for ts in states]
    run(copies)
    for ts, cs in zip(states, copies):
        torch._foreach_copy_(ts, cs)


def _half_dense(t):
    return t.dtype in (torch.float16, torch.bfloat16) and t.layout == torch.strided and t.device.type != "meta" \
        and dense(t)


def _steps(params, step):
    """One step counter per param, one below ``step`` (the ops advance their counters
    before using them). ``step`` may be a device tensor (Apex's capturable and
    mixed-precision kernels): it is then read on the device, with no host sync."""
    if isinstance(step, torch.Tensor):
        below = step.detach().reshape(()).to(device=params[0].device, dtype=torch.float32) - 1.0
        return [below.clone() for _ in params]
    return [torch.full((), float(step) - 1.0, device=p.device) for p in params]


def _divisor(inv_scale, device):
    """The ops divide grads by a scale; Apex's kernels multiply them by ``inv_scale``."""
    if inv_scale is None:
        return None
    inv = torch.as_tensor(inv_scale, device=device).reshape(()).double()
    return torch.reciprocal(inv).float()


def _value(x):
    return x.item() if isinstance(x, torch.Tensor) else x


def _grads_in(grads, dtype, scaled, run):
    """Runs ``run(grads)`` with the grads in ``dtype`` (core_ops' ops take the params'
    dtype). When ``scaled``, the op writes the unscaled grads back (Note [Grads written
    back unscaled] in csrc/include/core_ops/optimizer_args.h): grads of another dtype
    get them too."""
    # Only float grads are converted: any other goes to the op as it is, which names it.
    # A list of mixed dtypes (Apex's kernels took one a list) goes to the op as it is too.
    mixed = _one_dtype(grads) is None
    converted = [g.to(dtype) if not mixed and g.dtype != dtype and g.is_floating_point()
                 and g.layout == torch.strided and g.device.type != "meta" else g for g in grads]
    run(converted)
    moved = [(g, c) for g, c in zip(grads, converted) if c is not g]
    if scaled and moved:
        torch._foreach_copy_([g for g, _ in moved], [c for _, c in moved])


def _adam(g, p, m, v, masters, lr, beta1, beta2, epsilon, step, mode, bias_correction,
          weight_decay, grad_scale=None, found_inf=None):
    lr, lr_tensor = lr_arg(lr, p[0].device)
    _float_state([m, v], lambda s: op("fused_adam_")(
        p, g, s[0], s[1], [], masters, _steps(p, step), lr, beta1, beta2, epsilon, weight_decay,
        bool(mode), bool(bias_correction), False, False, lr_tensor, grad_scale, found_inf), p)


def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step, mode,
                      bias_correction, weight_decay, inv_scale=None):
    """Apex's Adam on ``[grads, params, exp_avgs, exp_avg_sqs]``; ``mode`` 0 is L2
    (decay added to the grad), 1 AdamW (decoupled decay); ``step`` already counts this
    step. ``noop_flag`` is ignored, as in Apex. Some Apex versions pass ``lr`` and
    ``step`` as tensors and a trailing ``inv_scale`` (grads are multiplied by it)."""
    g, p, m, v = tensor_lists_of(tensor_lists, (4,), "multi_tensor_adam")
    if not p:
        return
    _adam(g, p, m, v, [], lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay,
          _divisor(inv_scale, p[0].device))


def multi_tensor_adam_capturable(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon,
                                 step, mode, bias_correction, weight_decay, inv_scale):
    """Apex's Adam for ``FusedAdam(capturable=True)``: as ``multi_tensor_adam`` with
    ``lr`` and ``step`` device tensors, the grads multiplied by ``inv_scale``, and the
    step skipped (on the device) when ``noop_flag`` is set."""
    g, p, m, v = tensor_lists_of(tensor_lists, (4,), "multi_tensor_adam_capturable")
    if not p:
        return
    _adam(g, p, m, v, [], lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay,
          _divisor(inv_scale, p[0].device), noop_flag)


def multi_tensor_adam_capturable_master(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2,
                                        epsilon, step, mode, bias_correction, weight_decay,
                                        inv_scale):
    """As ``multi_tensor_adam_capturable`` on ``[grads, params, exp_avgs, exp_avg_sqs,
    fp32 master params]``: the masters are updated and copied into the params."""
    g, p, m, v, w = tensor_lists_of(tensor_lists, (5,), "multi_tensor_adam_capturable_master")
    if not p:
        return
    _adam(g, p, m, v, w, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay,
          _divisor(inv_scale, p[0].device), noop_flag)


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
    params, masters = (lists[3], p) if len(lists) == 4 else (p, [])
    grad_scale = None if scale == 1.0 else torch.full((), 1.0 / scale, device=g[0].device)
    _grads_in(g, params[0].dtype, grad_scale is not None, lambda grads: _float_state(
        [m], lambda s: op("fused_sgd_")(
            params, grads, s[0] if momentum else [], masters, float(_value(lr)), momentum,
            dampening, wd, bool(nesterov), bool(wd_after_momentum), bool(first_run), False, None,
            grad_scale, noop_flag), p))


def multi_tensor_adagrad(chunk_size, noop_flag, tensor_lists, lr, epsilon, mode, weight_decay):
    """Apex's Adagrad on ``[grads, params, state_sums]``; ``mode`` 0 is L2, 1 decoupled
    decay. ``noop_flag`` is ignored, as in Apex."""
    g, p, h = tensor_lists_of(tensor_lists, (3,), "multi_tensor_adagrad")
    if not p:
        return
    _float_state([h], lambda s: op("fused_adagrad_")(
        p, g, s[0], [], _steps(p, 1), float(_value(lr)), 0.0, epsilon, weight_decay, bool(mode),
        False, None, None, None), p)


# ---- LAMB ---------------------------------------------------------------------------


def _clip_divisor(global_grad_norm, max_grad_norm, device):
    """Apex's clipping: grads are divided by norm / max_grad_norm where the global norm
    exceeds max_grad_norm, else by 1 (computed on the device)."""
    norm = torch.as_tensor(global_grad_norm, device=device).detach().reshape(()).float()
    limit = torch.as_tensor(max_grad_norm, device=device).detach().reshape(()).float()
    return torch.where(norm > limit, norm / limit, torch.ones((), device=device))


def _one_dtype(ts):
    """The dtype of every tensor of ``ts``, or None where they differ (Apex's kernels
    took one dtype a list: such a list goes to the op as it is, which names it)."""
    dtypes = {t.dtype for t in ts}
    return dtypes.pop() if len(dtypes) == 1 else None


def _in_place(update, param):
    """Whether the op takes Apex's ``update`` of ``param`` as it is: in the state dtype,
    laid out as the param. (Apex kept updates in the param's dtype; those are
    converted. A sparse or meta tensor goes to the op as it is, which names it.)"""
    if update.layout != torch.strided or param.layout != torch.strided or "meta" in (update.device.type,
                                                                                     param.device.type):
        return True
    if not dense(update) or not update.is_floating_point():  # expanded, gapped, not float: the op says which
        return True
    return update.dtype == state_dtype(param.dtype) and same_layout(update, param)


def _lamb_stage1(g, p, m, v, masters, updates, step, beta1, beta2, epsilon, weight_decay,
                 adam_w_mode, bias_correction, grad_averaging, grad_divisor, found_inf):
    _grads_in(g, p[0].dtype, grad_divisor is not None, lambda grads: _float_state(
        [m, v], lambda s: op("fused_lamb_stage1_")(
            p, grads, s[0], s[1], masters, _steps(p, step), updates, beta1, beta2, epsilon,
            weight_decay, bool(adam_w_mode), bool(bias_correction), bool(grad_averaging), False,
            grad_divisor, found_inf), p))


def _lamb_stage2(p, masters, updates, lr, weight_decay, use_nvlamb, found_inf, param_norms=None,
                 update_norms=None):
    dtype = updates[0].dtype
    if param_norms is None:
        param_norms = ops.multi_tensor_l2norm(masters or p, per_tensor=True)[1]
    if update_norms is None:
        update_norms = ops.multi_tensor_l2norm(updates, per_tensor=True)[1]
    lr, lr_tensor = lr_arg(lr, p[0].device)
    op("fused_lamb_stage2_")(p, masters, updates, _norms_as(param_norms, p[0].device, dtype),
                             _norms_as(update_norms, p[0].device, dtype), lr, weight_decay,
                             bool(use_nvlamb), lr_tensor, found_inf)


def _norms_as(norms, device, dtype):
    """Apex's per-tensor norms (float32, float16 for half params) as the op takes them;
    norms that are not floating (or on meta) go to the op as they are, which names them."""
    if not norms.is_floating_point() or norms.device.type == "meta":
        return norms
    return norms.to(device, dtype)


def _lamb(g, p, m, v, masters, lr, beta1, beta2, epsilon, step, bias_correction, weight_decay,
          grad_averaging, mode, use_nvlamb, grad_divisor, found_inf=None):
    # The update is computed in float32 (Apex wrote it into the grads, in their dtype;
    # here the grads receive their unscaled, clipped values).
    weights = masters or p
    updates = [torch.empty_like(w, dtype=state_dtype(w.dtype)) for w in weights]
    _lamb_stage1(g, p, m, v, masters, updates, step, beta1, beta2, epsilon, weight_decay, mode,
                 bias_correction, grad_averaging, grad_divisor, found_inf)
    _lamb_stage2(p, masters, updates, lr, weight_decay, use_nvlamb, found_inf)


def multi_tensor_lamb(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step,
                      bias_correction, weight_decay, grad_averaging, mode, global_grad_norm,
                      max_grad_norm, use_nvlamb_python=None):
    """Apex's one-call LAMB on ``[grads, params, exp_avgs, exp_avg_sqs]``: grads divided
    by ``global_grad_norm / max_grad_norm`` where the norm exceeds the limit, Adam-style
    moments (``mode`` 0: L2 decay, 1: decoupled), then the trust ratio ||p|| / ||update||
    (for tensors with weight decay, or all with ``use_nvlamb``). ``noop_flag`` is
    ignored, as in Apex."""
    g, p, m, v = tensor_lists_of(tensor_lists, (4,), "multi_tensor_lamb")
    if not p:
        return
    _lamb(g, p, m, v, [], lr, beta1, beta2, epsilon, step, bias_correction, weight_decay,
          grad_averaging, mode, bool(use_nvlamb_python),
          _clip_divisor(global_grad_norm, max_grad_norm, p[0].device))


def multi_tensor_lamb_mp(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step,
                         bias_correction, weight_decay, grad_averaging, mode, global_grad_norm,
                         max_grad_norm, use_nvlamb_python, found_inf, inv_scale):
    """Apex's LAMB of ``FusedMixedPrecisionLamb`` on ``[grads, params, exp_avgs,
    exp_avg_sqs]`` or ``[half grads, fp32 master params, fp32 exp_avgs, fp32
    exp_avg_sqs, half params]``: as ``multi_tensor_lamb`` with ``lr``, ``step``,
    ``global_grad_norm`` and ``max_grad_norm`` device tensors (the norm and its limit
    both of the scaled grads), grads multiplied by ``inv_scale``, and the step skipped
    on the device when ``noop_flag`` is set (Apex's Python copies ``found_inf`` into
    it; the kernel reads only ``noop_flag``)."""
    lists = tensor_lists_of(tensor_lists, (4, 5), "multi_tensor_lamb_mp")
    g, p, m, v = lists[:4]
    if not p:
        return
    params, masters = (lists[4], p) if len(lists) == 5 else (p, [])
    device = p[0].device
    divisor = _clip_divisor(global_grad_norm, max_grad_norm, device) * _divisor(inv_scale, device)
    _lamb(g, params, m, v, masters, lr, beta1, beta2, epsilon, step, bias_correction,
          weight_decay, grad_averaging, mode, bool(use_nvlamb_python), divisor, noop_flag)


def multi_tensor_lamb_stage1_cuda(chunk_size, noop_flag, tensor_lists, per_tensor_decay, step,
                                  beta1, beta2, epsilon, global_grad_norm, max_global_grad_norm):
    """Apex's first LAMB stage on ``[grads, params, exp_avgs, exp_avg_sqs, updates]``:
    the moments (grad averaging, bias correction for step ``step + 1``) and the
    update with decoupled decay ``per_tensor_decay[i]``, written into ``updates``.
    The clipping is as ``multi_tensor_lamb``'s. The decays are read on the host (one
    fused call per distinct value). ``noop_flag`` is ignored, as in Apex."""
    g, p, m, v, u = tensor_lists_of(tensor_lists, (5,), "multi_tensor_lamb_stage1_cuda")
    if not p:
        return
    decays = torch.as_tensor(per_tensor_decay).reshape(-1).tolist()
    if len(decays) != len(p):
        raise ValueError(f"per_tensor_decay holds {len(decays)} values for {len(p)} params")
    divisor = _clip_divisor(global_grad_norm, max_global_grad_norm, p[0].device)
    step = step + 1
    for decay in dict.fromkeys(decays):
        at = [i for i, d in enumerate(decays) if d == decay]
        pick = [[ts[i] for i in at] for ts in (g, p, m, v, u)]
        ps, out = pick[1], pick[4]
        direct = _one_dtype(out) is None or all(_in_place(o, q) for o, q in zip(out, ps))
        updates = out if direct else [torch.empty_like(q, dtype=state_dtype(q.dtype)) for q in ps]
        _lamb_stage1(pick[0], ps, pick[2], pick[3], [], updates, step, beta1, beta2, epsilon,
                     decay, True, True, True, divisor, None)
        if not direct:
            torch._foreach_copy_(out, updates)


def multi_tensor_lamb_stage2_cuda(chunk_size, noop_flag, tensor_lists, per_tensor_param_norm,
                                  per_tensor_update_norm, lr, weight_decay, use_nvlamb_python=None):
    """Apex's second LAMB stage on ``[params, updates]``: ``p -= lr * ratio * update``
    with the trust ratio from the given per-tensor norms (for all tensors when
    ``weight_decay`` != 0 or ``use_nvlamb``). ``noop_flag`` is ignored, as in Apex."""
    p, u = tensor_lists_of(tensor_lists, (2,), "multi_tensor_lamb_stage2_cuda")
    if not p:
        return
    same_length(p, "params", u, "updates")  # before pairing them
    updates = u if _one_dtype(u) is None else [
        x if _in_place(x, q) else torch.empty_like(q, dtype=state_dtype(q.dtype)).copy_(x) for x, q in zip(u, p)]
    _lamb_stage2(p, [], updates, lr, weight_decay, bool(use_nvlamb_python), None,
                 per_tensor_param_norm, per_tensor_update_norm)


# ---- NovoGrad -----------------------------------------------------------------------


def multi_tensor_novograd(chunk_size, noop_flag, tensor_lists, grad_norms, lr, beta1, beta2,
                          epsilon, step, bias_correction, weight_decay, grad_averaging, mode,
                          norm_type):
    """Apex's NovoGrad on ``[grads, params, exp_avgs]``. ``grad_norms`` holds one norm
    per tensor, blended over the steps, and is updated in place as Apex's kernel does:
    L2 (``norm_type`` 2) ``sqrt(beta2 * n_prev^2 + (1 - beta2) * n^2)``, infinity
    norm (0) ``beta2 * n_prev + (1 - beta2) * n``, with n the norm of this step's grad
    (Apex's FusedNovoGrad starts it at the first grad's norm, or 0 with init_zero).
    ``mode`` 0 puts the normalised grad and the decay inside the moment (the paper),
    1 decouples them. ``noop_flag`` is ignored, as in Apex."""
    g, p, m = tensor_lists_of(tensor_lists, (3,), "multi_tensor_novograd")
    if not p:
        return
    if norm_type not in (0, 2):
        raise ValueError(f"norm_type must be 0 (infinity norm) or 2 (L2), got {norm_type}")
    if grad_norms.numel() != len(p):
        raise ValueError(f"grad_norms holds {grad_norms.numel()} norms for {len(p)} params")
    device, dtype = p[0].device, state_dtype(p[0].dtype)
    norms = ops.per_tensor_norms(g, norm_type, dtype)
    # core_ops keeps the blended square for L2 (the norm itself for the infinity norm)
    # and blends from it every step (init_zero: no first-step special case; Apex's
    # Python already started grad_norms where it wanted).
    kept = grad_norms.detach().to(device, dtype).reshape(-1, 1).clone()
    if norm_type == 2:
        kept.square_()
    lr, lr_tensor = lr_arg(lr, device)
    _float_state([m], lambda s: op("fused_novograd_")(
        p, g, s[0], list(kept.unbind(0)), [], _steps(p, step), norms, norm_type,
        lr, beta1, beta2, epsilon, weight_decay, bool(bias_correction), mode == 0,
        bool(grad_averaging), True, False, lr_tensor, None, None), p)
    kept = kept.reshape(grad_norms.shape)
    grad_norms.copy_(kept.sqrt() if norm_type == 2 else kept)
