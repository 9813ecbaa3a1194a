"""Legal calls of the multi-tensor ops and the loss-scale update, and their routes:
the raw op (torch.ops.core_ops, implied), the public function (core_ops.*), and Apex's
amp_C where it has the op. Every route is compared with the reference on the raw
arguments, so a route must do what the raw op does with them."""

import torch

from draw import FLOATS

HALF_OR_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _dtypes(d, lists):
    """One dtype a list: all float64, or each of float32 / float16 / bfloat16."""
    if d.chance(0.15):
        return [torch.float64] * lists
    return [d.pick(HALF_OR_FLOAT) for _ in range(lists)]


def _list(d, sizes, dtype, read_only, nonfinite=0.0):
    """A list of tensors: ``sizes`` are element counts (the first list of a call, its
    shapes drawn with its layouts) or another list, whose shapes this one takes."""
    out = []
    for n in sizes:
        layout = d.layout(read_only=read_only)
        t = d.shaped(n.shape, dtype, layout) if isinstance(n, torch.Tensor) else d.tensor(n, dtype, layout)
        if d.chance(nonfinite) and _writable(t):
            t = d.with_nonfinite(t)
        out.append(t)
    return out


def _writable(t):
    return all(s > 0 or n <= 1 for s, n in zip(t.stride(), t.shape))


def _flag(d):
    dtype = d.pick((torch.float32, torch.int32))
    return torch.full((1,), 1 if d.chance(0.1) else 0, dtype=dtype)


def _scalar(d, dtype=torch.float32):
    return torch.full((1,), d.pick((0.5, 1.0, 2.0, 65536.0, 1 / 65536, 0.0, -3.0)), dtype=dtype)


def _compute(dtypes):
    return torch.float64 if torch.float64 in dtypes else torch.float32


def draw_scale(d):
    sizes = d.sizes(d.count())
    src_t, dst_t = _dtypes(d, 2)
    src = _list(d, sizes, src_t, read_only=True, nonfinite=0.2)
    dst = src if (src_t == dst_t and d.chance(0.2) and all(map(_writable, src))) else \
        _list(d, src, dst_t, read_only=False)
    return [src, dst, _scalar(d, _compute([src_t, dst_t])), _flag(d)]


def draw_check_finite(d):
    sizes = d.sizes(d.count())
    return [_list(d, sizes, d.pick(FLOATS), read_only=True, nonfinite=0.3), _flag(d)]


def draw_axpby(d):
    sizes = d.sizes(d.count())
    x_t, y_t, out_t = _dtypes(d, 3)
    x = _list(d, sizes, x_t, read_only=True, nonfinite=0.15)
    y = _list(d, x, y_t, read_only=True, nonfinite=0.15)
    out = _list(d, x, out_t, read_only=False)
    if d.chance(0.2) and x_t == out_t and all(map(_writable, x)):
        out = x
    return [x, y, out, d.pick((1.0, -0.5, 2.0, 0.0)), d.pick((1.0, 0.25, -2.0)), _flag(d), d.pick((-1, 0, 1))]


def draw_l2norm(d):
    sizes = d.sizes(d.count())
    return [_list(d, sizes, d.pick(FLOATS), read_only=True, nonfinite=0.1), d.chance(0.5)]


def draw_unscale_l2norm(d):
    sizes = d.sizes(d.count())
    dtype = d.pick(FLOATS)
    tensors = _list(d, sizes, dtype, read_only=False, nonfinite=0.2)
    return [tensors, _scalar(d, _compute([dtype])), _flag(d), d.chance(0.5)]


def draw_update_scale(d):
    interval = d.pick((1, 2, 10, 2000, 2**31 - 1))
    hysteresis = d.pick((1, 2, 5))
    return [torch.full((1,), 2.0 ** d.rng.randint(-140, 30)),
            torch.full((1,), d.pick((0, 1, interval - 1, 2**31 - 1)), dtype=torch.int32),
            torch.full((1,), d.rng.randint(0, hysteresis), dtype=torch.int32), _flag(d),
            d.pick((1.0, 2.0, 1.5)), d.pick((0.5, 0.25)), interval, hysteresis,
            d.pick((0.0, 1.0, 2.0**-10)), d.pick((2.0**24, float("inf"), 2.0**10))]


# ---- routes -------------------------------------------------------------------------

def _core():
    import core_ops
    return core_ops


def _amp_c():
    import core_ops.compat.apex  # noqa: F401
    import amp_C
    return amp_C


def public_scale(src, dst, scale, found_inf):
    _core().multi_tensor_scale(src, dst, scale, found_inf)


def amp_c_scale(src, dst, scale, found_inf):
    _amp_c().multi_tensor_scale(2048 * 32, found_inf, [src, dst], scale)


def public_check_finite(tensors, found_inf):
    _core().multi_tensor_check_finite(tensors, found_inf)


def public_axpby(x, y, out, a, b, found_inf, arg_to_check):
    _core().multi_tensor_axpby(x, y, out, a, b, found_inf, arg_to_check)


def amp_c_axpby(x, y, out, a, b, found_inf, arg_to_check):
    _amp_c().multi_tensor_axpby(2048 * 32, found_inf, [x, y, out], a, b, arg_to_check)


def public_l2norm(tensors, per_tensor):
    return _core().multi_tensor_l2norm(tensors, per_tensor)


def public_unscale_l2norm(tensors, inv_scale, found_inf, per_tensor):
    total, per, _ = _core().multi_tensor_unscale_l2norm(tensors, inv_scale, found_inf, per_tensor)
    return total, per


def public_update_scale(scale, growth_tracker, hysteresis_tracker, found_inf, growth_factor, backoff_factor,
                        growth_interval, hysteresis, min_scale, max_scale):
    _core().update_scale(scale, growth_tracker, found_inf, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, hysteresis=hysteresis,
                         hysteresis_tracker=hysteresis_tracker, min_scale=min_scale, max_scale=max_scale)


SPECS = {
    "multi_tensor_scale_": (draw_scale, {"public": public_scale, "amp_C": amp_c_scale}),
    "multi_tensor_check_finite_": (draw_check_finite, {"public": public_check_finite}),
    "multi_tensor_axpby_": (draw_axpby, {"public": public_axpby, "amp_C": amp_c_axpby}),
    "multi_tensor_l2norm": (draw_l2norm, {"public": public_l2norm}),
    "multi_tensor_unscale_l2norm_": (draw_unscale_l2norm, {"public": public_unscale_l2norm}),
    "update_scale_": (draw_update_scale, {"public": public_update_scale}),
}
