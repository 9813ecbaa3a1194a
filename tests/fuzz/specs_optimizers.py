"""Legal calls of the fused optimizer ops (Note [Fused optimizer ops] in _schemas.py):
dense params of any dtype and layout, grads in any layout (the kernels copy those laid
out otherwise), state laid out as its param, float32 masters for half params, step
counts, and the optional lr tensor, grad scale and found-inf flag, with non-finite
grads where the flag or the scale decide what happens."""

import torch

from draw import FLOATS

HALF = (torch.float16, torch.bfloat16)


def _state_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _group(d, dtypes=FLOATS):
    """(params, grads, dtype): dense params, grads of their shapes in any layout."""
    dtype = d.pick(dtypes)
    sizes = d.sizes(d.count())
    params = [d.tensor(n, dtype, d.layout(dense_only=True)) for n in sizes]
    grads = []
    for p in params:
        g = d.like(p) if d.chance(0.6) else _other_layout(d, p)
        if d.chance(0.08):
            g = d.with_nonfinite(g)
        grads.append(g)
    return params, grads, dtype


def _other_layout(d, p):
    """A grad of p's shape laid out unlike p: contiguous, reversed dims, or a slice of
    a wider tensor (not dense)."""
    values = d.like(p).contiguous()
    kind = d.pick(("contiguous", "reversed", "sliced"))
    if kind == "reversed" and p.dim() >= 2:
        dims = list(range(p.dim()))[::-1]
        return values.permute(dims).contiguous().permute(dims)
    if kind == "sliced" and p.dim() >= 1:
        wide = torch.zeros(*p.shape[:-1], p.shape[-1] + 2, dtype=p.dtype)
        wide[..., : p.shape[-1]] = values
        return wide[..., : p.shape[-1]]
    return values


def _state(d, params, kind="normal"):
    return [d.like(p, _state_dtype(p.dtype), kind) for p in params]


def _masters(d, params, dtype):
    if dtype not in HALF or not d.chance(0.5):
        return []
    return [torch.empty_like(p, dtype=torch.float32).copy_(p) for p in params]


def _steps(d, params):
    start = d.pick((0.0, 1.0, 4.0, 999.0))
    return [torch.full((1,), start) for _ in params]


def _options(d, device_lr=True):
    """(lr_tensor, grad_scale, found_inf), each absent or a one-element tensor."""
    lr_tensor = torch.full((1,), d.pick((1e-3, 0.1))) if device_lr and d.chance(0.25) else None
    grad_scale = torch.full((1,), d.pick((1.0, 1024.0, 0.5))) if d.chance(0.3) else None
    found_inf = torch.full((1,), 1 if d.chance(0.2) else 0, dtype=d.pick((torch.float32, torch.int32))) \
        if d.chance(0.4) else None
    return lr_tensor, grad_scale, found_inf


def draw_adam(d):
    params, grads, dtype = _group(d)
    amsgrad = d.chance(0.25)
    return [params, grads, _state(d, params), _state(d, params, "positive"),
            _state(d, params, "positive") if amsgrad else [], _masters(d, params, dtype), _steps(d, params),
            d.pick((1e-3, 0.1)), d.pick((0.9, 0.0)), d.pick((0.999, 0.5)), d.pick((1e-8, 1e-3)),
            d.pick((0.0, 0.01)), d.chance(0.5), d.chance(0.8), amsgrad, d.chance(0.2), *_options(d)]


def draw_adam_compact(d):
    from core_ops.reference.compact_state import BLOCK, dynamic_map
    params, grads, dtype = _group(d, (torch.float32, torch.float16, torch.bfloat16))
    kind = d.pick(("float32", "bfloat16", "codes"))
    if kind == "codes":
        moments = [[torch.empty_like(p, dtype=torch.uint8).random_(0, 256, generator=d.gen) for p in params]
                   for _ in range(2)]
        absmaxes = [[torch.rand(-(-p.numel() // BLOCK), generator=d.gen) for p in params] for _ in range(2)]
        maps = [dynamic_map(True), dynamic_map(False)]
    else:
        moment_dtype = torch.float32 if kind == "float32" else torch.bfloat16
        moments = [_state(d, params), _state(d, params, "positive")]
        moments = [[m.to(moment_dtype) for m in ms] for ms in moments]
        absmaxes, maps = [[], []], [None, None]
    if dtype == torch.bfloat16 and d.chance(0.4):
        masters = [torch.empty_like(p, dtype=torch.int16).random_(-2**15, 2**15, generator=d.gen) for p in params]
    else:
        masters = _masters(d, params, dtype)
    return [params, grads, *moments, *absmaxes, masters, _steps(d, params), *maps, d.pick((1e-3, 0.1)),
            0.9, 0.999, 1e-8, d.pick((0.0, 0.01)), d.chance(0.5), True, d.chance(0.2), *_options(d)]


def draw_sgd(d):
    params, grads, dtype = _group(d)
    momentum = d.pick((0.0, 0.9))
    return [params, grads, _state(d, params) if momentum else [], _masters(d, params, dtype), d.pick((1e-3, 0.1)),
            momentum, d.pick((0.0, 0.1)), d.pick((0.0, 1e-4)), bool(momentum) and d.chance(0.5), d.chance(0.3),
            d.chance(0.3), d.chance(0.2), *_options(d)]


def draw_adagrad(d):
    params, grads, dtype = _group(d)
    return [params, grads, _state(d, params, "positive"), _masters(d, params, dtype), _steps(d, params),
            d.pick((1e-2, 0.1)), d.pick((0.0, 1e-3)), 1e-10, d.pick((0.0, 0.01)), d.chance(0.5), d.chance(0.2),
            *_options(d)]


def draw_lamb_stage1(d):
    params, grads, dtype = _group(d)
    _, grad_scale, found_inf = _options(d)
    return [params, grads, _state(d, params), _state(d, params, "positive"), _masters(d, params, dtype),
            _steps(d, params), _state(d, params), 0.9, 0.999, 1e-6, d.pick((0.0, 0.01)), d.chance(0.5),
            d.chance(0.8), d.chance(0.8), d.chance(0.2), grad_scale, found_inf]


def draw_lamb_step(d):
    """Both LAMB stages and the norms between them, as FusedLAMB.step takes them: the
    first stage's arguments with no updates (the step makes its own), then lr,
    use_nvlamb and lr_tensor."""
    args = draw_lamb_stage1(d)
    args[6] = []
    lr_tensor, _, _ = _options(d)
    return args + [d.pick((1e-3, 0.1)), d.chance(0.5), lr_tensor]


def ref_lamb_step(params, grads, exp_avgs, exp_avg_sqs, master_params, steps, updates, beta1, beta2, eps,
                  weight_decay, adam_w_mode, bias_correction, grad_averaging, maximize, grad_scale, found_inf, lr,
                  use_nvlamb, lr_tensor):
    from core_ops.reference import KERNELS as REF
    from core_ops.reference.norms import acc_dtype
    updates = [torch.zeros_like(p, dtype=_state_dtype(p.dtype)) if isinstance(p, torch.Tensor) and
               p.is_floating_point() else torch.zeros(0) for p in params]
    REF["fused_lamb_stage1_"](params, grads, exp_avgs, exp_avg_sqs, master_params, steps, updates, beta1, beta2,
                              eps, weight_decay, adam_w_mode, bias_correction, grad_averaging, maximize, grad_scale,
                              found_inf)
    if not params:
        return
    _, param_norms = REF["multi_tensor_l2norm"](master_params or params, True)
    _, update_norms = REF["multi_tensor_l2norm"](updates, True)
    REF["fused_lamb_stage2_"](params, master_params, updates, param_norms.to(acc_dtype(updates[0].dtype)),
                              update_norms, lr, weight_decay, use_nvlamb, lr_tensor, found_inf)


def draw_lamb_stage2(d):
    params, _, dtype = _group(d)
    acc = _state_dtype(dtype)
    n = len(params)
    lr_tensor, _, found_inf = _options(d)
    return [params, _masters(d, params, dtype), _state(d, params),
            torch.rand(n, generator=d.gen, dtype=torch.float64).to(acc),
            torch.rand(n, generator=d.gen, dtype=torch.float64).to(acc) * d.pick((1.0, 0.0)),
            d.pick((1e-3, 0.1)), d.pick((0.0, 0.01)), d.chance(0.5), lr_tensor, found_inf]


def draw_novograd(d):
    params, grads, dtype = _group(d)
    acc = _state_dtype(dtype)
    n = len(params)
    norm_type = d.pick((0, 2))
    if d.chance(0.5):  # this step's norms, as the class and amp_C compute them
        from core_ops.multi_tensor_apply.ops import per_tensor_norms
        norms = per_tensor_norms(grads, norm_type, acc) if params else torch.zeros(0, dtype=acc)
    else:
        norms = (torch.rand(n, generator=d.gen) * 3).to(acc)
    return [params, grads, _state(d, params), [torch.rand(1, generator=d.gen).to(acc) for _ in params],
            _masters(d, params, dtype), _steps(d, params), norms,
            norm_type, d.pick((1e-3, 0.1)), 0.95, 0.98, 1e-8, d.pick((0.0, 0.01)), d.chance(0.8),
            d.chance(0.5), d.chance(0.8), d.chance(0.5), d.chance(0.2), *_options(d)]


def floors_in_place(args, want):
    """An optimizer writes each tensor from its own old value and an update (p - lr *
    buf, m * buf + g), which can nearly cancel: a float32 result of 6.6e-5 from terms
    of 8.7e-4 is rightly off by a few 1e-5 of itself. So each written tensor is held
    to its dtype's tolerance of its old and new magnitudes together, which bound the
    terms of its last operation."""
    import outcome
    old, new = outcome.tensors_of(args), outcome.tensors_of(want[0])
    floors = {}
    for k, (a, b) in enumerate(zip(old, new)):
        if a.is_floating_point() and a.numel() and a.device.type != "meta":
            floors[k] = sum(t.double()[t.isfinite()].abs().max().item() if t.isfinite().any() else 0.0
                            for t in (a, b))
    return floors


def _specs():
    from routes_optimizers import ROUTES
    draws = {
        "fused_adam_": draw_adam,
        "fused_adam_compact_": draw_adam_compact,
        "fused_sgd_": draw_sgd,
        "fused_adagrad_": draw_adagrad,
        "fused_lamb_stage1_": draw_lamb_stage1,
        "fused_lamb_stage2_": draw_lamb_stage2,
        "fused_novograd_": draw_novograd,
    }
    specs = {name: (draw, ROUTES.get(name, {})) for name, draw in draws.items()}
    # FusedLAMB's step reaches both stages with the norms between: (draw, routes,
    # reference, the op whose schema bad.py puts faults into).
    specs["fused_lamb_stage1_+stage2_"] = (draw_lamb_step, {"class": ROUTES["lamb step"]}, ref_lamb_step,
                                           "fused_lamb_stage1_")
    return specs


SPECS = _specs()
FLOORS = dict.fromkeys(SPECS, floors_in_place)
