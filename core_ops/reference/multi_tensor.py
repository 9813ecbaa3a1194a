"""Reference kernels of the multi-tensor ops (see Note [Multi-tensor conventions]).

Written for clarity, not speed: they loop over tensors and never sync the host.
"""

import torch

from .._schemas import norm_dtype
from .._validate import check_arg_to_check, check_lists


def compute_dtype(*lists):
    """float64 if any list is float64, else float32: the precision the math runs in."""
    for ts in lists:
        if ts and ts[0].dtype == torch.float64:
            return torch.float64
    return torch.float32


def flag_nonfinite(found_inf, tensors):
    """found_inf := 1 where any element of ``tensors`` is inf or nan, without a host sync."""
    if not tensors:
        return
    bad = torch.stack([~torch.isfinite(t).all() for t in tensors]).any()
    found_inf.copy_(torch.maximum(found_inf, bad.to(found_inf.dtype).reshape(found_inf.shape)))


def multi_tensor_scale_(src, dst, scale, found_inf):
    check_lists(("src", src), ("dst", dst))
    acc = compute_dtype(src, dst)
    s = scale.reshape(()).to(acc)
    flag_nonfinite(found_inf, src)
    for x, out in zip(src, dst):
        out.copy_(x.to(acc) * s)


def multi_tensor_check_finite_(tensors, found_inf):
    check_lists(("tensors", tensors))
    flag_nonfinite(found_inf, tensors)


def multi_tensor_axpby_(x, y, out, a, b, found_inf, arg_to_check):
    check_arg_to_check(arg_to_check)
    check_lists(("x", x), ("y", y), ("out", out))
    acc = compute_dtype(x, y, out)
    if arg_to_check in (-1, 0):
        flag_nonfinite(found_inf, x)
    if arg_to_check in (-1, 1):
        flag_nonfinite(found_inf, y)
    for xi, yi, oi in zip(x, y, out):
        oi.copy_(a * xi.to(acc) + b * yi.to(acc))


def _norms(tensors, per_tensor, dtype):
    device = tensors[0].device if tensors else torch.device("cpu")
    if not tensors:
        return torch.zeros((), dtype=dtype, device=device), torch.zeros(0, dtype=dtype, device=device)
    norms = torch.stack([torch.linalg.vector_norm(t.to(dtype)) for t in tensors])
    total = torch.linalg.vector_norm(norms)
    return total, norms if per_tensor else norms.new_empty(0)


def multi_tensor_l2norm(tensors, per_tensor):
    check_lists(("tensors", tensors))
    return _norms(tensors, per_tensor, norm_dtype(tensors))


def multi_tensor_unscale_l2norm_(tensors, inv_scale, found_inf, per_tensor):
    check_lists(("tensors", tensors))
    acc = compute_dtype(tensors)
    s = inv_scale.reshape(()).to(acc)
    flag_nonfinite(found_inf, tensors)
    unscaled = [t.to(acc) * s for t in tensors]
    for t, u in zip(tensors, unscaled):
        t.copy_(u)
    # The norm is taken of the unscaled values before they are rounded to the
    # tensors' dtype: the native kernels do the same in one pass.
    return _norms(unscaled, per_tensor, norm_dtype(tensors))


KERNELS = {
    "multi_tensor_scale_": multi_tensor_scale_,
    "multi_tensor_check_finite_": multi_tensor_check_finite_,
    "multi_tensor_axpby_": multi_tensor_axpby_,
    "multi_tensor_l2norm": multi_tensor_l2norm,
    "multi_tensor_unscale_l2norm_": multi_tensor_unscale_l2norm_,
}
