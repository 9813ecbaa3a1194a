"""The stand-ins for Apex's compiled extension modules that code calls directly,
``fused_layer_norm_cuda``, ``fused_adam_cuda`` and ``syncbn``: Apex's argument order and return
values, checked against torch (norms) and against Apex's Adam formula written out."""

import math

import pytest
import torch
import torch.nn.functional as F

import core_ops.compat.apex  # noqa: F401  (installs the alias finder)
import fused_adam_cuda
import fused_layer_norm_cuda
import syncbn

# One rounding of the output dtype, after float32 math (Note [Test tolerances]).
TOL = {torch.float32: dict(rtol=2e-6, atol=2e-6), torch.float16: dict(rtol=1e-3, atol=1e-3),
       torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def inputs(dtype, shape=(3, 5, 24), hidden=(24,)):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    b = torch.randn(hidden, generator=g).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    return x, w, b, dy


def torch_grads(fn, x, params, dy):
    leaves = [t.detach().float().requires_grad_() for t in (x, *params)]
    y = fn(*leaves)
    y.backward(dy.float())
    return y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_layer_norm_affine_round_trip(dtype, memory_efficient):
    x, w, b, dy = inputs(dtype)
    y, mean, invvar = fused_layer_norm_cuda.forward_affine(x, [24], w, b, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    assert mean.shape == invvar.shape == (15,) and mean.dtype == torch.float32
    want_y, want = torch_grads(lambda x, w, b: F.layer_norm(x, (24,), w, b, 1e-5), x, (w, b), dy)
    torch.testing.assert_close(y.float(), want_y, **TOL[dtype])
    saved = y if memory_efficient else x
    dx, dw, db = fused_layer_norm_cuda.backward_affine(dy, None if memory_efficient else mean, invvar, saved,
                                                       [24], w, b, 1e-5, memory_efficient)
    assert dx.dtype == dw.dtype == db.dtype == dtype
    # Backward from a rounded output (memory_efficient, half) carries that rounding into xhat.
    tol = TOL[dtype] if not (memory_efficient and dtype != torch.float32) else dict(rtol=3e-2, atol=3e-2)
    for got, ref in zip((dx, dw, db), want):
        torch.testing.assert_close(got.float(), ref, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_affine_round_trip(dtype):
    x, w, _, dy = inputs(dtype)
    y, invvar = fused_layer_norm_cuda.rms_forward_affine(x, [24], w, 1e-5)
    want_y, want = torch_grads(lambda x, w: F.rms_norm(x, (24,), w, 1e-5), x, (w,), dy)
    torch.testing.assert_close(y.float(), want_y, **TOL[dtype])
    dx, dw = fused_layer_norm_cuda.rms_backward_affine(dy, invvar, x, [24], w, 1e-5, False)
    for got, ref in zip((dx, dw), want):
        torch.testing.assert_close(got.float(), ref, **TOL[dtype])


def test_the_plain_and_mixed_forms():
    x, w, b, dy = inputs(torch.float16)
    y, mean, invvar = fused_layer_norm_cuda.forward(x, [24], 1e-5)
    torch.testing.assert_close(y.float(), F.layer_norm(x.float(), (24,), eps=1e-5), **TOL[torch.float16])
    dx = fused_layer_norm_cuda.backward(dy, mean, invvar, x, [24], 1e-5)
    want = torch_grads(lambda x: F.layer_norm(x, (24,), eps=1e-5), x, (), dy)[1][0]
    torch.testing.assert_close(dx.float(), want, **TOL[torch.float16])
    y, invvar = fused_layer_norm_cuda.rms_forward(x, [24], 1e-5)
    dx = fused_layer_norm_cuda.rms_backward(dy, invvar, x, [24], 1e-5)
    want = torch_grads(lambda x: F.rms_norm(x, (24,), eps=1e-5), x, (), dy)[1][0]
    torch.testing.assert_close(dx.float(), want, **TOL[torch.float16])
    # Mixed: half input, float32 weights, output in the weights' dtype (Megatron's).
    y, _, _ = fused_layer_norm_cuda.forward_affine_mixed_dtypes(x, [24], w.float(), b.float(), 1e-5)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, F.layer_norm(x.float(), (24,), w.float(), b.float(), 1e-5), **TOL[torch.float32])
    y, _ = fused_layer_norm_cuda.rms_forward_affine_mixed_dtypes(x, [24], w.float(), 1e-5)
    assert y.dtype == torch.float32


def test_layer_norm_bad_input_is_named():
    x, w, b, _ = inputs(torch.float32)
    with pytest.raises(ValueError, match=r"normalized_shape \[23\] must be the trailing dims"):
        fused_layer_norm_cuda.forward_affine(x, [23], w, b, 1e-5)
    with pytest.raises(ValueError, match=r"gamma has shape \[3\]"):
        fused_layer_norm_cuda.forward_affine(x, [24], torch.ones(3), b, 1e-5)
    with pytest.raises(ValueError, match="mean may be None only with memory_efficient"):
        fused_layer_norm_cuda.backward_affine(x, None, torch.ones(15), x, [24], w, b, 1e-5, False)
    with pytest.raises(AttributeError, match="stand-in has no 'ln_fwd'"):
        fused_layer_norm_cuda.ln_fwd


def apex_adam(p, m, v, g, lr, b1, b2, eps, scale, step, mode, bias_correction, decay):
    """Apex's fused_adam_cuda kernel, element by element in float64."""
    out_p, out_m, out_v = [], [], []
    for pi, mi, vi, gi in zip(p.tolist(), m.tolist(), v.tolist(), g.tolist()):
        gi /= scale
        mi = b1 * mi + (1 - b1) * gi
        vi = b2 * vi + (1 - b2) * gi * gi
        denom = math.sqrt(vi + eps) if mode == 0 else math.sqrt(vi) + eps
        size = lr * math.sqrt(1 - b2**step) / (1 - b1**step) if bias_correction else lr
        out_p.append(pi - size * (mi / denom + decay * pi))
        out_m.append(mi)
        out_v.append(vi)
    return [torch.tensor(t, dtype=torch.float64) for t in (out_p, out_m, out_v)]


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("bias_correction", [1, 0])
def test_adam_follows_apex_formula(mode, bias_correction):
    g = torch.Generator().manual_seed(0)
    p, m = torch.randn(50, generator=g), torch.randn(50, generator=g) * 0.1
    v, grad = torch.rand(50, generator=g) * 0.01, torch.randn(50, generator=g) * 8
    args = (1e-2, 0.9, 0.999, 1e-8, 8.0, 3, mode, bias_correction, 0.01)
    grad = grad.half()  # a half grad with float32 params, as Apex's mixed-precision callers pass
    want = apex_adam(p.double(), m.double(), v.double(), grad.double(), *args)
    copy = torch.empty(50, dtype=torch.float16)
    fused_adam_cuda.adam(p, copy, m, v, grad, *args)
    for got, ref in zip((p, m, v), want):
        torch.testing.assert_close(got.double(), ref, rtol=2e-6, atol=1e-7)  # float32 math
    assert torch.equal(copy, p.half())


def test_adam_mt_equals_adam_and_the_casts():
    g = torch.Generator().manual_seed(1)
    make = lambda: [torch.randn(n, generator=g) for n in (7, 130)]  # noqa: E731
    p, m, v, grad = make(), make(), [t.abs() for t in make()], make()
    p2, m2, v2 = [t.clone() for t in p], [t.clone() for t in m], [t.clone() for t in v]
    args = (1e-3, 0.9, 0.99, 1e-6, 1.0, 2, 1, 1, 0.0)
    fused_adam_cuda.adam_mt(2048, torch.zeros(1, dtype=torch.int32), [p, m, v, grad], *args)
    for q, a, b, gr in zip(p2, m2, v2, grad):
        fused_adam_cuda.adam(q, q.new_empty(0), a, b, gr, *args)
    assert all(torch.equal(a, b) for a, b in zip(p + m + v, p2 + m2 + v2))
    flag = torch.zeros(1, dtype=torch.int32)
    fused_adam_cuda.strided_check_finite(flag, torch.tensor([1.0, math.inf, 2.0, 3.0]), 2, 1)
    assert flag.item() == 0  # the inf sits between the strided elements
    fused_adam_cuda.strided_check_finite(flag, torch.tensor([math.nan, 1.0]), 2, 1)
    assert flag.item() == 1
    out = torch.zeros(3, dtype=torch.float16)
    fused_adam_cuda.maybe_cast(flag, torch.ones(3), out)
    assert torch.equal(out, torch.zeros(3, dtype=torch.float16))  # the flag holds it back
    fused_adam_cuda.maybe_cast_mt(2048, torch.zeros(1, dtype=torch.int32), [[torch.ones(3)], [out]])
    assert torch.equal(out, torch.ones(3, dtype=torch.float16))


def test_adam_bad_input_is_named():
    p = torch.zeros(4)
    with pytest.raises(TypeError, match="p must be float32 or float64"):
        fused_adam_cuda.adam(p.half(), p.new_empty(0), p, p, p, 1e-3, 0.9, 0.99, 1e-8, 1.0, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match=r"v has shape \[3\]"):
        fused_adam_cuda.adam(p, p.new_empty(0), p.clone(), torch.zeros(3), p, 1e-3, 0.9, 0.99, 1e-8, 1.0, 1, 1, 1, 0.0)
    with pytest.raises(AttributeError, match="maybe_adam_undo are not provided"):
        fused_adam_cuda.maybe_adam_undo


# ---- syncbn --------------------------------------------------------------------------


def bn_case(dtype=torch.float64, shape=(6, 3, 5, 4)):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    w = torch.rand(shape[1], generator=g, dtype=torch.float64).to(dtype) + 0.5
    b = torch.randn(shape[1], generator=g, dtype=torch.float64).to(dtype)
    return x, dy, w, b


def test_syncbn_forward_and_backward_equal_torch_batch_norm():
    x, dy, w, b = bn_case()
    mean, var = syncbn.welford_mean_var(x)
    want_var, want_mean = torch.var_mean(x, dim=(0, 2, 3), correction=0)
    torch.testing.assert_close(mean, want_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(var, want_var, rtol=1e-12, atol=1e-12)
    inv_std = torch.rsqrt(var + 1e-5)
    out = syncbn.batchnorm_forward(x, mean, inv_std, w, b)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = F.batch_norm(leaves[0], None, None, leaves[1], leaves[2], training=True, eps=1e-5)
    ref.backward(dy)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    sum_dy, sum_dy_xmu, dw, db = syncbn.reduce_bn(dy, x, mean, inv_std, w)
    count = torch.tensor([x.numel() // 3], dtype=torch.int32)
    dx = syncbn.batchnorm_backward(dy, x, mean, inv_std, w, sum_dy, sum_dy_xmu, count)
    for got, want in ((dx, leaves[0].grad), (dw, leaves[1].grad), (db, leaves[2].grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_syncbn_merges_ranks_and_splits_the_backward_like_one_batch():
    x, dy, w, _ = bn_case()
    halves = [x[:2], x[2:]]  # unequal batches: 2 and 4 samples
    stats = [syncbn.welford_mean_var(h) for h in halves]
    counts = torch.tensor([h.numel() // 3 for h in halves], dtype=torch.int32)
    mean, var, inv_std = syncbn.welford_parallel(torch.stack([s[0] for s in stats]),
                                                 torch.stack([s[1] for s in stats]), counts, 1e-5)
    whole_mean, whole_var = syncbn.welford_mean_var(x)
    torch.testing.assert_close(mean, whole_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(var, whole_var, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(inv_std, torch.rsqrt(whole_var + 1e-5), rtol=1e-12, atol=1e-12)
    sums = [syncbn.reduce_bn(d, h, mean, inv_std, w)[:2] for d, h in ((dy[:2], x[:2]), (dy[2:], x[2:]))]
    sum_dy, sum_dy_xmu = (sums[0][0] + sums[1][0]), (sums[0][1] + sums[1][1])  # what the allreduce does
    dx = torch.cat([syncbn.batchnorm_backward(d, h, mean, inv_std, w, sum_dy, sum_dy_xmu, counts)
                    for d, h in ((dy[:2], x[:2]), (dy[2:], x[2:]))])
    whole = syncbn.reduce_bn(dy, x, mean, inv_std, w)
    want = syncbn.batchnorm_backward(dy, x, mean, inv_std, w, whole[0], whole[1], counts)
    torch.testing.assert_close(dx, want, rtol=1e-12, atol=1e-12)


def test_syncbn_channels_last_forms_equal_channels_first():
    x, dy, w, b = bn_case(torch.float32)
    xl, dyl = x.movedim(1, -1).contiguous(), dy.movedim(1, -1).contiguous()
    mean, var = syncbn.welford_mean_var(x)
    mean_l, var_l = syncbn.welford_mean_var_c_last(xl)
    torch.testing.assert_close(mean_l, mean, rtol=1e-6, atol=1e-6)  # float32 sums in another order
    inv_std = torch.rsqrt(var + 1e-5)
    z = torch.randn_like(xl)
    out = syncbn.batchnorm_forward_c_last(xl, z, mean, inv_std, w, b, True)
    want = F.relu(syncbn.batchnorm_forward(x, mean, inv_std, w, b).movedim(1, -1) + z)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    sums = syncbn.reduce_bn_c_last(dyl, xl, mean, inv_std, w)
    count = torch.tensor([x.numel() // 3], dtype=torch.int32)
    dx = syncbn.batchnorm_backward_c_last(dyl, xl, mean, inv_std, w, sums[0], sums[1], count)
    ref = syncbn.reduce_bn(dy, x, mean, inv_std, w)
    want_dx = syncbn.batchnorm_backward(dy, x, mean, inv_std, w, ref[0], ref[1], count).movedim(1, -1)
    torch.testing.assert_close(dx, want_dx, rtol=1e-5, atol=1e-5)
    masked = syncbn.relu_bw_c_last(dyl, xl, z, mean, inv_std, w, b)
    assert torch.equal(masked, torch.where(out > 0, dyl, torch.zeros_like(dyl)))
    with pytest.raises(AttributeError, match="syncbn stand-in has no 'welford_mean_var_fused'"):
        syncbn.welford_mean_var_fused


def test_syncbn_backward_refuses_sums_that_are_not_float():
    # The stand-in divides the sums by the count: an integer sum became a float mean and
    # was accepted. It now goes to the op as it is, which names it.
    x = torch.randn(4, 3, 5)
    mean, var = syncbn.welford_mean_var(x)
    inv_std = torch.rsqrt(var + 1e-5)
    g = torch.randn_like(x)
    sum_dy, sum_dy_xmu, _, _ = syncbn.reduce_bn(g, x, mean, inv_std)
    for bad in (sum_dy.to(torch.uint8), sum_dy.bool()):
        with pytest.raises(ValueError, match=r"mean_dy_xmu must be a \(3,\) torch.float32 tensor"):
            syncbn.batchnorm_backward(g, x, mean, inv_std, None, sum_dy, bad, torch.tensor([20]))
