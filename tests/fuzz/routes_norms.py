"""The other routes to the norm ops: Apex's ``fused_layer_norm_cuda`` and ``syncbn``
extensions, each given the raw op's arguments (specs_norms.py), and the public autograd
functions, which reach a forward and its backward together (specs in PUBLIC_SPECS: a
forward call plus the grads of its outputs, against the reference forward then the
reference backward).

As in routes_optimizers.py, a raw call a route cannot say raises NotThisRoute: Apex's
backward computes the input's grad in the saved tensor's dtype, and its affine forms
take a weight and a bias together."""

import torch

from outcome import NotThisRoute
from routes_optimizers import need


def _ln_cuda():
    import core_ops.compat.apex  # noqa: F401  (installs Apex's extension modules)
    import fused_layer_norm_cuda
    return fused_layer_norm_cuda


def _syncbn():
    import core_ops.compat.apex  # noqa: F401
    import syncbn
    return syncbn


def _width(input, hidden):
    """Apex's forms and the public ones take the normalized shape, not a count of
    elements: a call whose rows are not the input's last dim is not theirs."""
    need(isinstance(input, torch.Tensor) and input.dim() >= 1 and input.shape[-1] == hidden,
         "rows other than the input's last dim")


# ---- Apex's extensions ------------------------------------------------------------------

def apex_layer_norm_fwd(input, weight, bias, hidden, eps, out_dtype, memory_efficient):
    ext = _ln_cuda()
    _width(input, hidden)
    need((weight is None) == (bias is None), "a weight or a bias alone (Apex's forms take both or neither)")
    if weight is None:
        need(out_dtype in (None, input.dtype), "an output dtype without a weight")
        return ext.forward(input, (hidden,), eps)
    if out_dtype in (None, input.dtype):
        need(weight.dtype == input.dtype or not isinstance(weight, torch.Tensor), "mixed dtypes unasked")
        return ext.forward_affine(input, (hidden,), weight, bias, eps)
    need(weight.dtype == out_dtype, "an output dtype other than the weight's")
    return ext.forward_affine_mixed_dtypes(input, (hidden,), weight, bias, eps)


def apex_rms_norm_fwd(input, weight, hidden, eps, out_dtype, memory_efficient):
    ext = _ln_cuda()
    _width(input, hidden)
    if weight is None:
        need(out_dtype in (None, input.dtype), "an output dtype without a weight")
        return ext.rms_forward(input, (hidden,), eps)
    if out_dtype in (None, input.dtype):
        need(weight.dtype == input.dtype, "mixed dtypes unasked")
        return ext.rms_forward_affine(input, (hidden,), weight, eps)
    need(weight.dtype == out_dtype, "an output dtype other than the weight's")
    return ext.rms_forward_affine_mixed_dtypes(input, (hidden,), weight, eps)


def apex_layer_norm_bwd(grad_out, saved, mean, rstd, weight, bias, hidden, memory_efficient, dx_dtype):
    ext = _ln_cuda()
    _width(saved, hidden)
    need(dx_dtype == getattr(saved, "dtype", None), "an input grad in another dtype than the saved tensor's")
    need((weight is None) == (bias is None), "a weight or a bias alone")
    if weight is None:
        dx = ext.backward(grad_out, mean, rstd, saved, (hidden,), 1e-5, memory_efficient)
        return dx, saved.new_empty((0,)), saved.new_empty((0,))
    dx, dw, db = ext.backward_affine(grad_out, mean, rstd, saved, (hidden,), weight, bias, 1e-5, memory_efficient)
    return dx, dw, db


def apex_rms_norm_bwd(grad_out, saved, rstd, weight, hidden, memory_efficient, dx_dtype):
    ext = _ln_cuda()
    _width(saved, hidden)
    need(dx_dtype == getattr(saved, "dtype", None), "an input grad in another dtype than the saved tensor's")
    if weight is None:
        return ext.rms_backward(grad_out, rstd, saved, (hidden,), 1e-5, memory_efficient), saved.new_empty((0,))
    dx, dw = ext.rms_backward_affine(grad_out, rstd, saved, (hidden,), weight, 1e-5, memory_efficient)
    return dx, dw


def apex_bn_stats(input):
    return _syncbn().welford_mean_var(input)


def apex_bn_elemt(input, mean, invstd, weight, bias):
    return _syncbn().batchnorm_forward(input, mean, invstd, weight, bias)


def apex_bn_backward_reduce(grad_out, input, mean):
    # Without a weight, reduce_bn returns the two sums and two empty tensors; its
    # inv_std is read only for the weight's grad.
    sum_dy, sum_dy_xmu, _, _ = _syncbn().reduce_bn(grad_out, input, mean, mean)
    return sum_dy, sum_dy_xmu


def apex_bn_backward_elemt(grad_out, input, mean, invstd, weight, mean_dy, mean_dy_xmu):
    # Apex passes sums and every rank's count; one rank of one element makes the means
    # the sums, exactly.
    need(isinstance(mean_dy, torch.Tensor) and mean_dy.is_floating_point(), "a mean to pass as a sum")
    return _syncbn().batchnorm_backward(grad_out, input, mean, invstd, weight, mean_dy, mean_dy_xmu,
                                        torch.ones(1, dtype=torch.int32))


ROUTES = {
    "layer_norm_fwd": {"apex": apex_layer_norm_fwd},
    "rms_norm_fwd": {"apex": apex_rms_norm_fwd},
    "layer_norm_bwd": {"apex": apex_layer_norm_bwd},
    "rms_norm_bwd": {"apex": apex_rms_norm_bwd},
    "sync_batch_norm_stats": {"apex": apex_bn_stats},
    "sync_batch_norm_elemt": {"apex": apex_bn_elemt},
    "sync_batch_norm_backward_reduce": {"apex": apex_bn_backward_reduce},
    "sync_batch_norm_backward_elemt": {"apex": apex_bn_backward_elemt},
}


# ---- the public autograd functions: a forward and its backward ----------------------------

def _leaf(t):
    """``t`` as a leaf autograd tracks, on the same memory (its layout is the case's)."""
    if t is None:
        return None
    need(isinstance(t, torch.Tensor) and t.is_floating_point() and t.layout == torch.strided
         and t.device.type == "cpu", "a tensor autograd cannot track")
    return t.detach().requires_grad_()


def _backward(outputs, grads, leaves):
    # Autograd casts a grad to its output's dtype: a grad of another dtype is not a
    # call the backward op sees.
    need(all(isinstance(g, torch.Tensor) and g.dtype == y.dtype and g.shape == y.shape and g.layout == torch.strided
             and g.device == y.device for y, g in zip(outputs, grads)), "a grad autograd would convert")
    torch.autograd.backward(outputs, grads)
    return tuple(None if t is None else t.grad for t in leaves)


def _ref(name):
    from core_ops.reference import KERNELS
    return KERNELS[name]


def ref_layer_norm(input, weight, bias, hidden, eps, out_dtype, memory_efficient, grad):
    y, mean, rstd = _ref("layer_norm_fwd")(input, weight, bias, hidden, eps, out_dtype, memory_efficient)
    dx, dw, db = _ref("layer_norm_bwd")(grad, y if memory_efficient else input, mean, rstd, weight, bias, hidden,
                                        memory_efficient, input.dtype)
    return y, dx, None if weight is None else dw, None if bias is None else db


def public_layer_norm(input, weight, bias, hidden, eps, out_dtype, memory_efficient, grad):
    from core_ops.normalization.fused import layer_norm
    _width(input, hidden)
    leaves = [_leaf(input), _leaf(weight), _leaf(bias)]
    y = layer_norm(leaves[0], (hidden,), leaves[1], leaves[2], eps, memory_efficient, out_dtype)
    return (y.detach(), *_backward([y], [grad], leaves))


def apex_layer_norm(input, weight, bias, hidden, eps, out_dtype, memory_efficient, grad):
    """Apex's autograd functions, as Megatron-LM calls them."""
    from core_ops.normalization import functional as F
    _width(input, hidden)
    need((weight is None) == (bias is None) and out_dtype in (None, input.dtype), "a form Apex has no function of")
    leaves = [_leaf(input), _leaf(weight), _leaf(bias)]
    if weight is None:
        y = F.FusedLayerNormFunction.apply(leaves[0], (hidden,), eps, memory_efficient)
    else:
        y = F.FusedLayerNormAffineFunction.apply(leaves[0], leaves[1], leaves[2], (hidden,), eps, memory_efficient)
    return (y.detach(), *_backward([y], [grad], leaves))


def ref_rms_norm(input, weight, hidden, eps, out_dtype, memory_efficient, grad):
    y, rstd = _ref("rms_norm_fwd")(input, weight, hidden, eps, out_dtype, memory_efficient)
    dx, dw = _ref("rms_norm_bwd")(grad, y if memory_efficient else input, rstd, weight, hidden, memory_efficient,
                                  input.dtype)
    return y, dx, None if weight is None else dw


def public_rms_norm(input, weight, hidden, eps, out_dtype, memory_efficient, grad):
    from core_ops.normalization.fused import rms_norm
    _width(input, hidden)
    leaves = [_leaf(input), _leaf(weight)]
    y = rms_norm(leaves[0], (hidden,), leaves[1], eps, memory_efficient, out_dtype)
    return (y.detach(), *_backward([y], [grad], leaves))


def apex_rms_norm(input, weight, hidden, eps, out_dtype, memory_efficient, grad):
    from core_ops.normalization import functional as F
    _width(input, hidden)
    need(out_dtype in (None, input.dtype), "a form Apex has no function of")
    leaves = [_leaf(input), _leaf(weight)]
    if weight is None:
        y = F.FusedRMSNormFunction.apply(leaves[0], (hidden,), eps, memory_efficient)
    else:
        y = F.FusedRMSNormAffineFunction.apply(leaves[0], leaves[1], (hidden,), eps, memory_efficient)
    return (y.detach(), *_backward([y], [grad], leaves))


def ref_fused_add_rms_norm(input, residual, weight, hidden, eps, memory_efficient, grad_y, grad_h):
    y, h, rstd = _ref("fused_add_rms_norm_fwd")(input, residual, weight, hidden, eps, memory_efficient)
    dh, dw = _ref("rms_norm_bwd")(grad_y, y if memory_efficient else h, rstd, weight, hidden, memory_efficient,
                                  input.dtype)
    dh = dh + grad_h  # h's own grad joins the norm's; input and residual each take the sum
    return y, h, dh, dh.clone(), None if weight is None else dw


def public_fused_add_rms_norm(input, residual, weight, hidden, eps, memory_efficient, grad_y, grad_h):
    from core_ops.normalization.fused import fused_add_rms_norm
    _width(input, hidden)
    leaves = [_leaf(input), _leaf(residual), _leaf(weight)]
    need(weight is None or tuple(weight.shape) == (hidden,), "a weight the public form reads the width from")
    y, h = fused_add_rms_norm(leaves[0], leaves[1], leaves[2], eps, memory_efficient)
    return (y.detach(), h.detach(), *_backward([y, h], [grad_y, grad_h], leaves))
