"""``core_ops.reference.norms`` (the math of the fused_layer_norm_cuda stand-in) against
torch's layer_norm / rms_norm and autograd, in float64."""

import pytest
import torch
import torch.nn.functional as F

from core_ops.reference import norms

FP64 = dict(rtol=1e-12, atol=1e-12)  # the same formulas in another order of sums


def case(rows=7, hidden=33, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g, dtype=torch.float64) * 3 + 1
    w = torch.randn(hidden, generator=g, dtype=torch.float64)
    b = torch.randn(hidden, generator=g, dtype=torch.float64)
    dy = torch.randn(rows, hidden, generator=g, dtype=torch.float64)
    return x, w, b, dy


def torch_grads(fn, x, params, dy):
    leaves = [t.detach().clone().requires_grad_() for t in (x, *params)]
    y = fn(*leaves)
    y.backward(dy)
    return y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_layer_norm_forward_and_backward_equal_torch(affine, memory_efficient):
    x, w, b, dy = case()
    params = (w, b) if affine else ()
    want_y, want_grads = torch_grads(lambda x, *p: F.layer_norm(x, (33,), *p, eps=1e-5), x, params, dy)
    y, mean, rstd = norms.layer_norm_forward(x, *(params or (None, None)), 1e-5)
    torch.testing.assert_close(y, want_y, **FP64)
    torch.testing.assert_close(mean, x.mean(-1), **FP64)
    torch.testing.assert_close(rstd, 1 / torch.sqrt(x.var(-1, unbiased=False) + 1e-5), **FP64)
    saved = y if memory_efficient else x
    dx, dw, db = norms.layer_norm_backward(dy, mean, rstd, saved, *(params or (None, None)), memory_efficient)
    for got, want in zip([dx, dw, db] if affine else [dx], want_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)  # xhat recomputed from y: a few ulps more
    if not affine:
        assert dw is None and db is None


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_rms_norm_forward_and_backward_equal_torch(affine, memory_efficient):
    x, w, _, dy = case()
    params = (w,) if affine else ()
    want_y, want_grads = torch_grads(lambda x, *p: F.rms_norm(x, (33,), *p, eps=1e-5), x, params, dy)
    y, rstd = norms.rms_norm_forward(x, w if affine else None, 1e-5)
    torch.testing.assert_close(y, want_y, **FP64)
    saved = y if memory_efficient else x
    dx, dw = norms.rms_norm_backward(dy, rstd, saved, w if affine else None, memory_efficient)
    for got, want in zip([dx, dw] if affine else [dx], want_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_half_input_is_normalized_in_float32():
    x = (torch.randn(4, 64) * 100).half()
    y, mean, rstd = norms.layer_norm_forward(x, None, None, 1e-5)
    assert y.dtype == mean.dtype == rstd.dtype == torch.float32
    torch.testing.assert_close(y, F.layer_norm(x.float(), (64,), eps=1e-5), rtol=1e-6, atol=1e-6)


# One of weight and bias alone: from the output, xhat must still undo the one there is
# (a bias alone shifts the output; the kernels once ignored it without a weight).
@pytest.mark.parametrize("which", ["weight", "bias"])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_layer_norm_with_weight_or_bias_alone_equals_torch(which, memory_efficient):
    x, w, b, dy = case()
    weight, bias = (w, None) if which == "weight" else (None, b)
    leaves = [x.clone().requires_grad_(), (weight if which == "weight" else bias).clone().requires_grad_()]
    fn = (lambda x, p: F.layer_norm(x, (33,), p, None, eps=1e-5)) if which == "weight" else \
        (lambda x, p: F.layer_norm(x, (33,), None, p, eps=1e-5))
    fn(*leaves).backward(dy)
    y, mean, rstd = norms.layer_norm_forward(x, weight, bias, 1e-5)
    dx, dw, db = norms.layer_norm_backward(dy, mean, rstd, y if memory_efficient else x, weight, bias,
                                           memory_efficient)
    torch.testing.assert_close(dx, leaves[0].grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dw if which == "weight" else db, leaves[1].grad, rtol=1e-10, atol=1e-10)
    assert (db if which == "weight" else dw) is None
