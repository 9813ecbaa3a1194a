"""Legal calls of the layer / RMS norm ops (Note [Norm ops]) and the sync batch-norm
pieces (Note [Sync batch norm ops]): inputs of any layout and dtype, rows around the
vector widths, empty batches, weights and biases alone or together in their own dtypes,
the mixed float32 output of half input, backward from the input or from the output."""

import torch

from draw import FLOATS

HALF = (torch.float16, torch.bfloat16)


def _rows_input(d):
    hidden = d.pick((1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 255, 257, 1024, 1025, 4097))
    rows = d.pick((0, 1, 2, 3, 5, 8, 33))
    dtype = d.pick(FLOATS)
    lead = d.pick(((rows,), (1, rows), (rows, 1)))
    values = (d.values(rows * hidden, torch.float64) * 3 + 0.5).to(dtype).reshape(*lead, hidden)
    layout = d.pick(("contiguous", "offset", "sliced", "transposed"))
    if layout == "offset":  # dense, one element into its storage: unaligned rows
        flat = torch.empty(values.numel() + 1, dtype=dtype)
        base = flat[1:].view(values.shape)
    elif layout == "sliced":  # rows of a wider matrix: not contiguous
        base = torch.zeros(*lead, hidden + 4, dtype=dtype)[..., :hidden]
    elif layout == "transposed" and len(lead) == 1:
        base = torch.empty(hidden, rows, dtype=dtype).t()
    else:
        base = torch.empty_like(values)
    base.copy_(values)
    return base, hidden, dtype


def _param(d, hidden, dtype, present=0.7):
    if not d.chance(present):
        return None
    p_dtype = dtype if d.chance(0.7) else d.pick(FLOATS)
    return (d.values(hidden, torch.float64, "positive") + 0.5).to(p_dtype)


def _out_dtype(d, dtype):
    return torch.float32 if dtype in HALF and d.chance(0.3) else (dtype if d.chance(0.2) else None)


def draw_layer_norm_fwd(d):
    x, hidden, dtype = _rows_input(d)
    return [x, _param(d, hidden, dtype), _param(d, hidden, dtype) if d.chance(0.8) else None, hidden,
            d.pick((1e-5, 1e-12, 0.1)), _out_dtype(d, dtype), d.chance(0.5)]


def draw_rms_norm_fwd(d):
    x, hidden, dtype = _rows_input(d)
    return [x, _param(d, hidden, dtype), hidden, d.pick((1e-5, 1e-12, 0.1)), _out_dtype(d, dtype), d.chance(0.5)]


def draw_fused_add_rms_norm_fwd(d):
    x, hidden, dtype = _rows_input(d)
    residual = torch.empty_like(x).copy_(d.values(x.numel(), dtype).reshape(x.shape))
    return [x, residual, _param(d, hidden, dtype), hidden, d.pick((1e-5, 0.1)), d.chance(0.5)]


def _grad_like(d, out):
    return d.values(out.numel(), out.dtype).reshape(out.shape)


def draw_layer_norm_bwd(d):
    from core_ops.reference import KERNELS as REF
    x, w, b, hidden, eps, out_dtype, efficient = draw_layer_norm_fwd(d)
    out, mean, rstd = REF["layer_norm_fwd"](x, w, b, hidden, eps, out_dtype, efficient)
    return [_grad_like(d, out), out if efficient else x, mean, rstd, w, b, hidden, efficient, x.dtype]


def draw_rms_norm_bwd(d):
    from core_ops.reference import KERNELS as REF
    x, w, hidden, eps, out_dtype, efficient = draw_rms_norm_fwd(d)
    out, rstd = REF["rms_norm_fwd"](x, w, hidden, eps, out_dtype, efficient)
    return [_grad_like(d, out), out if efficient else x, rstd, w, hidden, efficient, x.dtype]


# ---- sync batch norm ----------------------------------------------------------------

def _bn_input(d):
    dtype = d.pick(FLOATS)
    n, c = d.pick((0, 1, 2, 5)), d.pick((1, 3, 8, 17))
    spatial = d.pick(((), (7,), (3, 5), (2, 9)))
    x = d.values(n * c * max(1, _prod(spatial)), dtype).reshape(n, c, *spatial) if spatial else \
        d.values(n * c, dtype).reshape(n, c)
    if len(spatial) == 2 and d.chance(0.5):
        x = x.contiguous(memory_format=torch.channels_last)
    elif d.chance(0.2) and x.dim() >= 2:
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    return x, c, dtype


def _prod(shape):
    out = 1
    for s in shape:
        out *= s
    return out


def _per_channel(d, c, dtype, kind="normal"):
    return d.values(c, torch.float64, kind).to(torch.float64 if dtype == torch.float64 else torch.float32)


def _affine(d, c):
    return (d.values(c, torch.float64, "positive").to(d.pick(FLOATS)) if d.chance(0.7) else None)


def draw_bn_stats(d):
    return [_bn_input(d)[0]]


def draw_bn_elemt(d):
    x, c, dtype = _bn_input(d)
    return [x, _per_channel(d, c, dtype), _per_channel(d, c, dtype, "positive"), _affine(d, c), _affine(d, c)]


def draw_bn_backward_reduce(d):
    x, c, dtype = _bn_input(d)
    return [torch.empty_like(x).copy_(d.values(x.numel(), dtype).reshape(x.shape)), x, _per_channel(d, c, dtype)]


def draw_bn_backward_elemt(d):
    x, c, dtype = _bn_input(d)
    return [torch.empty_like(x).copy_(d.values(x.numel(), dtype).reshape(x.shape)), x, _per_channel(d, c, dtype),
            _per_channel(d, c, dtype, "positive"), _affine(d, c), _per_channel(d, c, dtype),
            _per_channel(d, c, dtype)]


# ---- a forward and the grads of its outputs (the public autograd routes) ----------------

def draw_layer_norm_autograd(d):
    args = draw_layer_norm_fwd(d)
    x, out_dtype = args[0], args[5]
    return args + [d.values(x.numel(), out_dtype or x.dtype).reshape(x.shape)]


def draw_rms_norm_autograd(d):
    args = draw_rms_norm_fwd(d)
    x, out_dtype = args[0], args[4]
    return args + [d.values(x.numel(), out_dtype or x.dtype).reshape(x.shape)]


def draw_fused_add_rms_norm_autograd(d):
    args = draw_fused_add_rms_norm_fwd(d)
    x = args[0]
    return args + [d.values(x.numel(), x.dtype).reshape(x.shape) for _ in range(2)]


# ---- how large an input grad's terms are --------------------------------------------------
# A norm's input grad is rstd * (w*g - mean(w*g) - xhat * mean(w*g*xhat)): terms of
# rstd * |w*g| that cancel, exactly for a row of two (xhat is +-1 there) and nearly
# for short rows. Its error is a rounding of those terms, so it is compared relative to
# them, not to what is left after the cancelling.

def _grad_terms(grad, rstd, weight):
    w = 1.0 if weight is None else max(weight.double().abs().max().item(), 1.0)
    finite = rstd.double()[rstd.double().isfinite()]
    top = finite.abs().max().item() if finite.numel() else 0.0
    return 3.0 * top * grad.double().abs().max().item() * w if grad.numel() else 0.0


def _positions(want):
    from outcome import tensors_of
    return len(tensors_of(want[0]))


def floors_layer_norm_bwd(args, want):
    grad, _, _, rstd, weight = args[:5]
    return {_positions(want): _grad_terms(grad, rstd, weight)}


def floors_rms_norm_bwd(args, want):
    grad, _, rstd, weight = args[:4]
    return {_positions(want): _grad_terms(grad, rstd, weight)}


def floors_layer_norm_autograd(args, want):
    from core_ops.reference import KERNELS as REF
    rstd = REF["layer_norm_fwd"](*args[:7])[2]
    return {_positions(want) + 1: _grad_terms(args[7], rstd, args[1])}


def floors_rms_norm_autograd(args, want):
    from core_ops.reference import KERNELS as REF
    rstd = REF["rms_norm_fwd"](*args[:6])[1]
    return {_positions(want) + 1: _grad_terms(args[6], rstd, args[1])}


def floors_fused_add_rms_norm_autograd(args, want):
    from core_ops.reference import KERNELS as REF
    rstd = REF["fused_add_rms_norm_fwd"](*args[:6])[2]
    terms = _grad_terms(args[6], rstd, args[2]) + (args[7].double().abs().max().item() if args[7].numel() else 0.0)
    n = _positions(want)
    return {n + 2: terms, n + 3: terms}


FLOORS = {
    "layer_norm_bwd": floors_layer_norm_bwd,
    "rms_norm_bwd": floors_rms_norm_bwd,
    "layer_norm_fwd+bwd": floors_layer_norm_autograd,
    "rms_norm_fwd+bwd": floors_rms_norm_autograd,
    "fused_add_rms_norm_fwd+bwd": floors_fused_add_rms_norm_autograd,
}


def _specs():
    import routes_norms as r
    native = {
        "layer_norm_fwd": draw_layer_norm_fwd,
        "layer_norm_bwd": draw_layer_norm_bwd,
        "rms_norm_fwd": draw_rms_norm_fwd,
        "rms_norm_bwd": draw_rms_norm_bwd,
        "fused_add_rms_norm_fwd": draw_fused_add_rms_norm_fwd,
        "sync_batch_norm_stats": draw_bn_stats,
        "sync_batch_norm_elemt": draw_bn_elemt,
        "sync_batch_norm_backward_reduce": draw_bn_backward_reduce,
        "sync_batch_norm_backward_elemt": draw_bn_backward_elemt,
    }
    specs = {name: (draw, r.ROUTES.get(name, {})) for name, draw in native.items()}
    # (draw, routes, reference, the op whose schema bad.py puts faults into)
    specs.update({
        "layer_norm_fwd+bwd": (draw_layer_norm_autograd, {"public": r.public_layer_norm,
                                                              "apex": r.apex_layer_norm},
                                  r.ref_layer_norm, "layer_norm_fwd"),
        "rms_norm_fwd+bwd": (draw_rms_norm_autograd, {"public": r.public_rms_norm, "apex": r.apex_rms_norm},
                                r.ref_rms_norm, "rms_norm_fwd"),
        "fused_add_rms_norm_fwd+bwd": (draw_fused_add_rms_norm_autograd,
                                          {"public": r.public_fused_add_rms_norm}, r.ref_fused_add_rms_norm,
                                          "fused_add_rms_norm_fwd"),
    })
    return specs


SPECS = _specs()
