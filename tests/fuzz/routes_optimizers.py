"""The other routes to the fused optimizer ops: Apex's ``amp_C`` functions and the public
optimizer classes, each given the raw op's arguments (specs_optimizers.py) and calling
the op its own way.

A route is an adapter that plays its caller's part. Apex's Python optimizers keep the
step count on the host and pass it in, so the amp_C adapter reads the raw call's step
counters, passes their common value and advances them after the call, as Apex's
FusedAdam does; the class adapter installs the raw call's tensors as the optimizer's
state and grads, so the class's kernel call writes into them. A raw call the route
cannot say (amsgrad through amp_C, step counters that differ, a state list one tensor
short, which the class would fill with zeros) raises NotThisRoute and is left to the
other routes: what is compared is what each caller can ask for."""

import torch

from outcome import NotThisRoute


def need(condition, why):
    if not condition:
        raise NotThisRoute(why)


def _amp_c():
    import core_ops.compat.apex  # noqa: F401  (installs amp_C)
    import amp_C
    return amp_C


CHUNK = 2048 * 32


def _plain(t, numel=1):
    """Whether ``t`` is a host tensor of ``numel`` elements an adapter may read."""
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided \
        and t.numel() == numel


def _storage(t):
    return t.untyped_storage().data_ptr()


def _common_step(steps, params, *others):
    """The one count every param's step counter holds (Apex keeps one per group, and
    the counters made from it are the adapter's own: none may share memory with
    another tensor of the call, ``others``: tensors and lists)."""
    need(len(steps) == len(params) and steps, "per-param step counters")
    need(all(_plain(s) and s.dtype == torch.float32 for s in steps), "float32 host step counters")
    need(len({_storage(s) for s in steps}) == len(steps), "step counters that share memory")
    flat = [t for o in others for t in (o if isinstance(o, (list, tuple)) else [o])]
    lone = {_storage(t) for t in flat if isinstance(t, torch.Tensor) and t.layout == torch.strided
            and t.device.type == "cpu"}
    need(not lone & {_storage(s) for s in steps}, "a step counter that is another argument")
    values = {s.item() for s in steps}
    need(len(values) == 1, "step counters that differ")
    return values.pop()


def _advance(steps, found_inf):
    """Apex's Python side: the step count moves on unless the step was skipped."""
    if found_inf is None or not found_inf.item():
        for s in steps:
            s.add_(1)


def _noop(found_inf):
    """amp_C's noop_flag: found_inf itself where it can be one, else a clear one."""
    if found_inf is None:
        return torch.zeros(1, dtype=torch.int32)
    need(_plain(found_inf) and found_inf.dtype in (torch.float32, torch.int32), "a noop_flag amp_C takes")
    return found_inf


def _inverse(grad_scale, dtype=torch.float32):
    """Apex passes 1 / scale; the scales drawn are powers of two, so it is exact."""
    need(_plain(grad_scale) and grad_scale.is_floating_point(), "a host grad scale to invert")
    return torch.reciprocal(grad_scale.double()).to(dtype)


def _same_lengths(params, *lists, may_be_empty=()):
    for k, ts in enumerate(lists):
        need(len(ts) == len(params) or (k in may_be_empty and not ts), "lists of one length")


# ---- amp_C ----------------------------------------------------------------------------
# Apex's functions return at once on empty lists: a raw call with no params (whose lone
# tensors the op still checks) is not theirs.

def amp_c_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps, lr, beta1, beta2,
               eps, weight_decay, adam_w_mode, bias_correction, amsgrad, maximize, lr_tensor, grad_scale,
               found_inf):
    need(params, "no params")
    need(not amsgrad and not max_exp_avg_sqs and not maximize, "amsgrad or maximize")
    _same_lengths(params, grads, exp_avgs, exp_avg_sqs, master_params, may_be_empty=(3,))
    step = _common_step(steps, params, lr_tensor, grad_scale, found_inf, params, grads, exp_avgs, exp_avg_sqs,
                        master_params) + 1
    need(grad_scale is None or grad_scale.layout != torch.strided or _storage(grad_scale) not in {_storage(t) for ts in (grads, exp_avgs, exp_avg_sqs,
                                                                              master_params) for t in ts
                                                              if t.layout == torch.strided},
         "a grad scale that is a list's tensor (amp_C is given its inverse, a tensor of its own)")
    amp_c = _amp_c()
    lr_ = lr if lr_tensor is None else lr_tensor
    if not master_params and found_inf is None:
        inv = None if grad_scale is None else _inverse(grad_scale)
        amp_c.multi_tensor_adam(CHUNK, torch.zeros(1, dtype=torch.int32), [grads, params, exp_avgs, exp_avg_sqs],
                                lr_, beta1, beta2, eps, step, int(adam_w_mode), int(bias_correction), weight_decay,
                                inv)
    else:
        # The capturable forms: noop_flag skips the step; the scale is always given.
        inv = torch.ones(1) if grad_scale is None else _inverse(grad_scale)
        lists = [grads, params, exp_avgs, exp_avg_sqs] + ([master_params] if master_params else [])
        fn = amp_c.multi_tensor_adam_capturable_master if master_params else amp_c.multi_tensor_adam_capturable
        fn(CHUNK, _noop(found_inf), lists, lr_, beta1, beta2, eps, torch.tensor([step]), int(adam_w_mode),
           int(bias_correction), weight_decay, inv)
    _advance(steps, found_inf)


def amp_c_sgd(params, grads, momentum_buffers, master_params, lr, momentum, dampening, weight_decay, nesterov,
              wd_after_momentum, first_step, maximize, lr_tensor, grad_scale, found_inf):
    need(params, "no params")
    need(not maximize and lr_tensor is None, "maximize or a device lr")
    need(bool(momentum_buffers) == bool(momentum), "momentum buffers exactly with momentum")
    need(not master_params or momentum_buffers, "masters without momentum (Apex's lists hold both)")
    _same_lengths(params, grads, momentum_buffers, master_params, may_be_empty=(1, 2))
    # Apex's SGD took grads of another float dtype than the params (fp16 grads of fp32
    # weights): amp_C converts those, so such a call is not the raw op's.
    need(all(isinstance(g, torch.Tensor) and g.dtype == params[0].dtype for g in grads), "grads amp_C would convert")
    scale = 1.0 if grad_scale is None else _inverse(grad_scale).item()
    if master_params:
        lists = [grads, master_params, momentum_buffers, params]
    else:
        lists = [grads, params, momentum_buffers]
    _amp_c().multi_tensor_sgd(CHUNK, _noop(found_inf), lists, weight_decay, momentum, dampening, lr, nesterov,
                              first_step, wd_after_momentum, scale)


def amp_c_adagrad(params, grads, state_sums, master_params, steps, lr, lr_decay, eps, weight_decay, adagrad_w_mode,
                  maximize, lr_tensor, grad_scale, found_inf):
    need(params, "no params")
    # Apex's Adagrad has no step count: its lr never decays.
    need(lr_decay == 0.0 and not master_params and not maximize, "lr decay, masters or maximize")
    need(lr_tensor is None and grad_scale is None and found_inf is None, "a device lr, a scale or a flag")
    _same_lengths(params, grads, state_sums)
    _common_step(steps, params, params, grads, state_sums)
    _amp_c().multi_tensor_adagrad(CHUNK, torch.zeros(1, dtype=torch.int32), [grads, params, state_sums], lr, eps,
                                  int(adagrad_w_mode), weight_decay)
    _advance(steps, None)


def amp_c_lamb_stage1(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, updates, beta1, beta2, eps,
                      weight_decay, adam_w_mode, bias_correction, grad_averaging, maximize, grad_scale, found_inf):
    need(params, "no params")
    need(adam_w_mode and bias_correction and grad_averaging and not maximize, "a LAMB Apex's stage 1 does not do")
    need(not master_params and found_inf is None, "masters or a flag")
    _same_lengths(params, grads, exp_avgs, exp_avg_sqs, updates)
    from core_ops._validate import same_layout, state_dtype
    # Apex's updates were in the params' dtype: amp_C takes any and converts; the call
    # is the raw op's only where no conversion happens.
    need(all(isinstance(u, torch.Tensor) and isinstance(p, torch.Tensor) and u.dtype == state_dtype(p.dtype)
             and same_layout(u, p) for u, p in zip(updates, params)), "updates amp_C would convert")
    step = _common_step(steps, params, grad_scale, params, grads, exp_avgs, exp_avg_sqs, updates)
    # Apex's clipping divides the grads by global_norm / max_norm where it exceeds it:
    # a scale of s >= 1 is global_norm s against max_norm 1.
    norm = 0.0 if grad_scale is None else _inverse(_inverse(grad_scale)).item()
    need(norm == 0.0 or norm >= 1.0, "a scale under 1 (clipping only ever divides by more than 1)")
    _amp_c().multi_tensor_lamb_stage1_cuda(CHUNK, torch.zeros(1, dtype=torch.int32),
                                           [grads, params, exp_avgs, exp_avg_sqs, updates],
                                           torch.full((len(params),), weight_decay), step, beta1, beta2, eps,
                                           norm, 1.0)
    _advance(steps, None)


def amp_c_lamb_stage2(params, master_params, updates, param_norms, update_norms, lr, weight_decay, use_nvlamb,
                      lr_tensor, found_inf):
    need(params, "no params")
    from core_ops._validate import same_layout, state_dtype
    need(not master_params and found_inf is None, "masters or a flag")
    need(all(isinstance(u, torch.Tensor) and isinstance(p, torch.Tensor) and u.dtype == state_dtype(p.dtype)
             and same_layout(u, p) for u, p in zip(updates, params)), "updates amp_C would convert")
    _amp_c().multi_tensor_lamb_stage2_cuda(CHUNK, torch.zeros(1, dtype=torch.int32), [params, updates],
                                           param_norms, update_norms, lr if lr_tensor is None else lr_tensor,
                                           weight_decay, use_nvlamb)


def amp_c_novograd(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, grad_norms, norm_type, lr, beta1,
                   beta2, eps, weight_decay, bias_correction, reg_inside_moment, grad_averaging, init_zero, maximize,
                   lr_tensor, grad_scale, found_inf):
    need(params, "no params")
    from core_ops.multi_tensor_apply import ops
    need(init_zero and not maximize and not master_params, "a first step taken from the grad, maximize or masters")
    need(grad_scale is None and found_inf is None, "a scale or a flag")
    _same_lengths(params, grads, exp_avgs, exp_avg_sqs)
    step = _common_step(steps, params, params, grads, exp_avgs, exp_avg_sqs, grad_norms) + 1
    state = torch.float64 if params[0].dtype == torch.float64 else torch.float32
    need(norm_type in (0, 2) and all(_plain(v) and v.dtype == state for v in exp_avg_sqs),
         "one kept norm per tensor, in the state dtype (amp_C takes them as one tensor of its own)")
    need(all(_plain(g, g.numel()) for g in grads), "host grads")
    # Apex's kernel computes this step's norms itself: the raw call's must be them.
    need(_plain(grad_norms, len(params)) and torch.equal(
        grad_norms, ops.per_tensor_norms(grads, norm_type, grad_norms.dtype).to(grad_norms.device)),
         "grad_norms that are not the grads' norms")
    kept = torch.stack([v.reshape(()) for v in exp_avg_sqs])
    blended = kept.sqrt() if norm_type == 2 else kept.clone()  # Apex keeps the norm, the op its square
    _amp_c().multi_tensor_novograd(CHUNK, torch.zeros(1, dtype=torch.int32), [grads, params, exp_avgs], blended,
                                   lr if lr_tensor is None else lr_tensor, beta1, beta2, eps, step,
                                   int(bias_correction), weight_decay, int(grad_averaging),
                                   0 if reg_inside_moment else 1, norm_type)
    for v, b in zip(exp_avg_sqs, blended):
        v.copy_((b.square() if norm_type == 2 else b).reshape(v.shape))
    _advance(steps, None)


# ---- the optimizer classes ---------------------------------------------------------------

def _optimizer(cls, params, grads, lr, lr_tensor, **options):
    """``cls`` over ``params`` with ``grads`` as their .grad: a route the class can take
    (torch refuses a grad of another dtype or shape; the class refuses options
    torch.optim refuses, e.g. betas outside [0, 1), when it is made)."""
    need(params, "no params (torch.optim refuses an empty list)")
    need(all(isinstance(p, torch.Tensor) and p.layout == torch.strided for p in params), "dense params")
    need(len({id(p) for p in params}) == len(params), "a param twice (the class's own error)")
    need(len({p.dtype for p in params}) <= 1 and len({p.device for p in params}) <= 1, "one group")
    try:
        for p, g in zip(params, grads):
            p.grad = g
    except (RuntimeError, TypeError) as e:
        raise NotThisRoute(f"a .grad torch refuses: {e}") from None
    try:
        return cls(params, lr=lr if lr_tensor is None else lr_tensor, **options)
    except ValueError as e:
        raise NotThisRoute(f"options the class refuses: {e}") from None


def _install(opt, params, grads, **lists):
    """Each list's tensors as the state of the params, under the list's key: ``key=(tensors,
    dtype)``. State is the class's own (made by it, or by load_state_dict, which copies
    into tensors it makes): laid out as it makes them, in its dtype, each with memory
    of its own, or the call is not one the class can be given."""
    from core_ops._validate import same_layout, state_dtype
    seen = {_storage(t) for t in list(params) + list(grads) if t.layout == torch.strided and t.device.type == "cpu"}
    for key, (ts, dtype) in lists.items():
        for t, p in zip(ts, params):
            want = dtype or state_dtype(p.dtype)
            need(isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device == p.device
                 and t.dtype == want, f"state {key} the class would not hold")
            if key == "step" or key.endswith("absmax") or (key == "exp_avg_sq" and t.numel() == 1 < p.numel()):
                need(t.is_contiguous(), f"state {key} laid out otherwise")
            else:
                need(t.shape == p.shape and same_layout(t, p), f"state {key} laid out otherwise than its param")
            need(_storage(t) not in seen, f"state {key} sharing memory")
            seen.add(_storage(t))
    for i, p in enumerate(params):
        for key, (ts, _) in lists.items():
            if ts:
                opt.state[p][key] = ts[i]


def _masters_option(params, master_params):
    """The class keeps fp32 masters for half params only, and for all of them."""
    if not master_params:
        return False
    need(all(p.dtype in (torch.float16, torch.bfloat16) for p in params), "masters of float32 params")
    return True


def class_adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps, lr, beta1, beta2, eps,
               weight_decay, adam_w_mode, bias_correction, amsgrad, maximize, lr_tensor, grad_scale, found_inf):
    from core_ops.optimizers import FusedAdam
    _same_lengths(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps,
                  may_be_empty=(3, 4))
    need(bool(max_exp_avg_sqs) == bool(amsgrad and params), "maxima exactly with amsgrad")
    opt = _optimizer(FusedAdam, params, grads, lr, lr_tensor, betas=(beta1, beta2), eps=eps,
                     weight_decay=weight_decay, adam_w_mode=adam_w_mode, bias_correction=bias_correction,
                     amsgrad=amsgrad, maximize=maximize, master_weights=_masters_option(params, master_params))
    _install(opt, params, grads, exp_avg=(exp_avgs, None), exp_avg_sq=(exp_avg_sqs, None),
             max_exp_avg_sq=(max_exp_avg_sqs, None), master_param=(master_params, None), step=(steps, torch.float32))
    opt.step(grad_scale=grad_scale, found_inf=found_inf)


def class_adam_compact(params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes, master_params,
                       steps, exp_avg_map, exp_avg_sq_map, lr, beta1, beta2, eps, weight_decay, adam_w_mode,
                       bias_correction, maximize, lr_tensor, grad_scale, found_inf):
    from core_ops.optimizers import FusedAdam
    from core_ops.reference.compact_state import dynamic_map
    _same_lengths(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, may_be_empty=(3,))
    need(params, "no params (the class makes no call)")
    kinds = {t.dtype for t in exp_avgs + exp_avg_sqs}
    need(len(kinds) == 1, "moments of one dtype")
    kind = kinds.pop()
    state_dtype = {torch.float32: torch.float32, torch.bfloat16: torch.bfloat16, torch.uint8: "int8"}.get(kind)
    need(state_dtype is not None, "moments of a dtype the class keeps")
    if kind == torch.uint8:  # the class's own maps, block maxima beside the codes
        _same_lengths(params, exp_avg_absmaxes, exp_avg_sq_absmaxes)
        need(all(_plain(m, 256) and m.dtype == torch.float32 for m in (exp_avg_map, exp_avg_sq_map)), "both maps")
        need(torch.equal(exp_avg_map, dynamic_map(True)) and torch.equal(exp_avg_sq_map, dynamic_map(False)),
             "maps other than the class's")
    else:
        need(not exp_avg_absmaxes and not exp_avg_sq_absmaxes and exp_avg_map is None and exp_avg_sq_map is None,
             "block maxima or maps beside float moments")
    remainders = bool(master_params) and master_params[0].dtype == torch.int16
    masters = "remainder" if remainders else _masters_option(params, master_params)
    opt = _optimizer(FusedAdam, params, grads, lr, lr_tensor, betas=(beta1, beta2), eps=eps,
                     weight_decay=weight_decay, adam_w_mode=adam_w_mode, bias_correction=bias_correction,
                     maximize=maximize, master_weights=masters, state_dtype=state_dtype, min_8bit_size=0)
    _install(opt, params, grads, exp_avg=(exp_avgs, kind), exp_avg_sq=(exp_avg_sqs, kind),
             exp_avg_absmax=(exp_avg_absmaxes, torch.float32), exp_avg_sq_absmax=(exp_avg_sq_absmaxes, torch.float32),
             step=(steps, torch.float32),
             **{"master_remainder": (master_params, torch.int16)} if remainders else
             {"master_param": (master_params, torch.float32)})
    opt.step(grad_scale=grad_scale, found_inf=found_inf)


def class_sgd(params, grads, momentum_buffers, master_params, lr, momentum, dampening, weight_decay, nesterov,
              wd_after_momentum, first_step, maximize, lr_tensor, grad_scale, found_inf):
    from core_ops.optimizers import FusedSGD
    _same_lengths(params, grads, momentum_buffers, master_params, may_be_empty=(1, 2))
    need(bool(momentum_buffers) == bool(momentum and params), "buffers exactly with momentum")
    need(not (nesterov and (momentum <= 0 or dampening != 0)), "torch.optim.SGD's nesterov rule")
    # The class's first step is a param without a buffer; one that may be skipped keeps
    # its own buffer rules (FusedSGD._step_group), so a first step goes unflagged.
    need(not (first_step and momentum and found_inf is not None), "a first step that may be skipped")
    opt = _optimizer(FusedSGD, params, grads, lr, lr_tensor, momentum=momentum, dampening=dampening,
                     weight_decay=weight_decay, nesterov=nesterov, wd_after_momentum=wd_after_momentum,
                     maximize=maximize, master_weights=_masters_option(params, master_params))
    _install(opt, params, grads, master_param=(master_params, torch.float32), momentum_buffer=(momentum_buffers, None))
    if first_step:
        for p in params:
            opt.state[p].pop("momentum_buffer", None)
    opt.step(grad_scale=grad_scale, found_inf=found_inf)
    if first_step:  # the buffers the class made are the raw call's
        for p, b in zip(params, momentum_buffers):
            b.copy_(opt.state[p]["momentum_buffer"])


def class_adagrad(params, grads, state_sums, master_params, steps, lr, lr_decay, eps, weight_decay, adagrad_w_mode,
                  maximize, lr_tensor, grad_scale, found_inf):
    from core_ops.optimizers import FusedAdagrad
    _same_lengths(params, grads, state_sums, master_params, steps, may_be_empty=(2,))
    opt = _optimizer(FusedAdagrad, params, grads, lr, lr_tensor, lr_decay=lr_decay, eps=eps,
                     weight_decay=weight_decay, adagrad_w_mode=adagrad_w_mode, maximize=maximize,
                     master_weights=_masters_option(params, master_params))
    _install(opt, params, grads, sum=(state_sums, None), master_param=(master_params, torch.float32),
             step=(steps, torch.float32))
    opt.step(grad_scale=grad_scale, found_inf=found_inf)


def class_novograd(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, grad_norms, norm_type, lr, beta1,
                   beta2, eps, weight_decay, bias_correction, reg_inside_moment, grad_averaging, init_zero, maximize,
                   lr_tensor, grad_scale, found_inf):
    from core_ops.multi_tensor_apply import ops
    from core_ops.optimizers import FusedNovoGrad
    _same_lengths(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, may_be_empty=(3,))
    need(norm_type in (0, 2) and exp_avg_sqs, "a norm the class takes")
    need(all(_plain(g, g.numel()) for g in grads), "host grads")
    # The class computes this step's norms itself, of the grads as they are (scaled), in
    # its kept norms' dtype; under a flag, a norm that overflows skips the step.
    need(_plain(grad_norms, len(params)) and grad_norms.dtype == exp_avg_sqs[0].dtype and torch.equal(
        grad_norms, ops.per_tensor_norms(grads, norm_type, grad_norms.dtype).to(grad_norms.device)),
         "grad_norms that are not the grads' norms")
    need(found_inf is None or bool(grad_norms.isfinite().all()), "a norm that overflows under a flag")
    opt = _optimizer(FusedNovoGrad, params, grads, lr, lr_tensor, betas=(beta1, beta2), eps=eps,
                     weight_decay=weight_decay, bias_correction=bias_correction,
                     reg_inside_moment=reg_inside_moment, grad_averaging=grad_averaging, norm_type=norm_type,
                     init_zero=init_zero, maximize=maximize, master_weights=_masters_option(params, master_params))
    _install(opt, params, grads, exp_avg=(exp_avgs, None), exp_avg_sq=(exp_avg_sqs, None),
             master_param=(master_params, torch.float32), step=(steps, torch.float32))
    opt.step(grad_scale=grad_scale, found_inf=found_inf)


def class_lamb(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, updates, beta1, beta2, eps, weight_decay,
               adam_w_mode, bias_correction, grad_averaging, maximize, grad_scale, found_inf, lr, use_nvlamb,
               lr_tensor):
    from core_ops.optimizers import FusedLAMB
    _same_lengths(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, may_be_empty=(3,))
    need(not updates, "updates of the caller's (the step makes its own)")
    opt = _optimizer(FusedLAMB, params, grads, lr, lr_tensor, betas=(beta1, beta2), eps=eps,
                     weight_decay=weight_decay, adam_w_mode=adam_w_mode, bias_correction=bias_correction,
                     grad_averaging=grad_averaging, max_grad_norm=0.0, use_nvlamb=use_nvlamb, maximize=maximize,
                     master_weights=_masters_option(params, master_params))
    _install(opt, params, grads, exp_avg=(exp_avgs, None), exp_avg_sq=(exp_avg_sqs, None),
             master_param=(master_params, torch.float32), step=(steps, torch.float32))
    opt.step(grad_scale=grad_scale, found_inf=found_inf)


ROUTES = {
    "lamb step": class_lamb,
    "fused_adam_": {"amp_C": amp_c_adam, "class": class_adam},
    "fused_adam_compact_": {"class": class_adam_compact},
    "fused_sgd_": {"amp_C": amp_c_sgd, "class": class_sgd},
    "fused_adagrad_": {"amp_C": amp_c_adagrad, "class": class_adagrad},
    "fused_lamb_stage1_": {"amp_C": amp_c_lamb_stage1},
    "fused_lamb_stage2_": {"amp_C": amp_c_lamb_stage2},
    "fused_novograd_": {"amp_C": amp_c_novograd, "class": class_novograd},
}
