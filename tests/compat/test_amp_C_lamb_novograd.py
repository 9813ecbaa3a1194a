"""amp_C's LAMB, NovoGrad, capturable Adam and l2norm_scale kernels against Apex's
formulas, written here in float64 from Apex's CUDA sources (multi_tensor_lamb.cu,
multi_tensor_lamb_mp.cu, multi_tensor_lamb_stage_1/2.cu, multi_tensor_novograd.cu).

Tolerances: float32 results of one step are compared with the float64 formula at
rtol 2e-6 (a handful of float32 roundings per element, and the trust ratio's norms);
bf16 params must equal their fp32 masters rounded (they are written from them).
"""

import math

import pytest
import torch
from torch.testing import assert_close

from core_ops.multi_tensor_apply import amp_C, multi_tensor_applier
from core_ops.optimizers import FusedLAMB, FusedNovoGrad

F32 = dict(rtol=2e-6, atol=1e-7)


def tensors(seed, shapes=((5, 3), (7,), (2, 2, 2))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def apex_lamb_reference(g, p, m, v, *, lr, beta1, beta2, eps, step, bias_correction, wd,
                        grad_averaging, mode, clip, use_nvlamb=False, decays=None):
    """Apex's LAMB (both stages) in float64; returns new (p, m, v, updates)."""
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    out = []
    for i, (gi, pi, mi, vi) in enumerate(zip(g, p, m, v)):
        gi, pi, mi, vi = (t.double() for t in (gi, pi, mi, vi))
        decay = wd if decays is None else decays[i]
        sg = gi / clip
        if mode == 0:
            sg = sg + decay * pi
        mi = mi * beta1 + beta3 * sg
        vi = vi * beta2 + (1 - beta2) * sg * sg
        u = (mi / bc1) / ((vi / bc2).sqrt() + eps)
        if mode == 1:
            u = u + decay * pi
        ratio = lr
        pn, un = pi.norm(), u.norm()
        if (use_nvlamb or decay != 0) and pn != 0 and un != 0:
            ratio = lr * (pn / un)
        out.append((pi - ratio * u, mi, vi, u))
    return [list(x) for x in zip(*out)]


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("wd, max_norm", [(0.01, 0.5), (0.0, 100.0)])
def test_multi_tensor_lamb_is_apex_formula(mode, wd, max_norm):
    g, p = tensors(0), tensors(1)
    m = [t.abs() * 0.1 for t in tensors(2)]
    v = [t.abs() * 0.01 for t in tensors(3)]
    norm = math.sqrt(sum(float(x.double().square().sum()) for x in g))
    clip = norm / max_norm if norm > max_norm else 1.0
    expect = apex_lamb_reference(g, p, m, v, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-6, step=3,
                                 bias_correction=True, wd=wd, grad_averaging=True, mode=mode,
                                 clip=clip)
    noop = torch.zeros(1, dtype=torch.int32)
    gnorm = multi_tensor_applier(amp_C.multi_tensor_l2norm, noop, [g], False)[0]
    multi_tensor_applier(amp_C.multi_tensor_lamb, noop, [g, p, m, v], 0.1, 0.9, 0.999, 1e-6, 3,
                         1, wd, 1, mode, gnorm, max_norm, False)
    for got, want in zip((p, m, v), expect[:3]):
        for a, b in zip(got, want):
            assert_close(a, b.float(), **F32)


def test_multi_tensor_lamb_steps_like_fused_lamb():
    """Apex's FusedLAMB loop over amp_C (global norm from multi_tensor_l2norm, then
    multi_tensor_lamb) gives core_ops' FusedLAMB, step for step."""
    params = [torch.nn.Parameter(t) for t in tensors(4)]
    ours = [torch.nn.Parameter(t.detach().clone()) for t in params]
    opt = FusedLAMB(ours, lr=0.05, weight_decay=0.01, max_grad_norm=1.0)
    m = [torch.zeros_like(t) for t in params]
    v = [torch.zeros_like(t) for t in params]
    noop = torch.zeros(1, dtype=torch.int32)
    for step in range(1, 6):
        grads = tensors(10 + step)
        for q, gr in zip(ours, grads):
            q.grad = gr.clone()
        opt.step()
        gnorm = multi_tensor_applier(amp_C.multi_tensor_l2norm, noop, [grads], False)[0]
        multi_tensor_applier(amp_C.multi_tensor_lamb, noop, [grads, [p.data for p in params], m, v],
                             0.05, 0.9, 0.999, 1e-6, step, 1, 0.01, 1, 1, gnorm, 1.0, False)
    for a, b in zip(params, ours):
        assert_close(a.data, b.data, rtol=1e-6, atol=1e-7)


def test_multi_tensor_lamb_mp_unscales_clips_and_skips_on_noop():
    grads32 = [t * 0.5 for t in tensors(5)]
    scale = 1024.0
    g = [(t * scale).bfloat16() for t in grads32]  # scaled half grads
    masters = tensors(6)
    params = [t.bfloat16() for t in masters]
    m = [torch.zeros_like(t) for t in masters]
    v = [torch.zeros_like(t) for t in masters]
    before = [t.clone() for t in (*masters, *params, *m, *v)]
    gnorm = multi_tensor_applier(amp_C.multi_tensor_l2norm_mp, torch.zeros(1, dtype=torch.int32), [g], False)[0]
    max_norm = torch.tensor([1.0 * scale])  # Apex passes max_grad_norm * scale
    lists = [g, masters, m, v, params]
    args = (torch.tensor([0.1]), 0.9, 0.999, 1e-6, torch.tensor([1], dtype=torch.int32), 1, 0.01, 1,
            1, gnorm, max_norm, False, torch.zeros(1), torch.tensor([1 / scale]))

    noop = torch.ones(1, dtype=torch.int32)  # an overflow: nothing may change
    multi_tensor_applier(amp_C.multi_tensor_lamb_mp, noop, lists, *args)
    assert all(torch.equal(a, b) for a, b in zip((*masters, *params, *m, *v), before))

    noop.zero_()
    scaled = [t.clone() for t in g]
    multi_tensor_applier(amp_C.multi_tensor_lamb_mp, noop, lists, *args)
    unscaled = [t.double() / scale for t in scaled]
    norm = float(gnorm) / scale
    for now, u in zip(g, unscaled):  # the grads the update used: unscaled and clipped
        assert_close(now.double(), u / max(norm, 1.0), rtol=2**-8, atol=0)
    expect = apex_lamb_reference(unscaled, [t.clone() for t in before[:3]], [torch.zeros_like(t) for t in masters],
                                 [torch.zeros_like(t) for t in masters], lr=0.1, beta1=0.9, beta2=0.999,
                                 eps=1e-6, step=1, bias_correction=True, wd=0.01, grad_averaging=True,
                                 mode=1, clip=max(norm / 1.0, 1.0))
    for got, want in zip((masters, m, v), expect[:3]):
        for a, b in zip(got, want):
            assert_close(a, b.float(), **F32)
    assert all(torch.equal(h, w.bfloat16()) for h, w in zip(params, masters))


def test_lamb_stage1_and_stage2_with_per_tensor_decay():
    g, p = tensors(7), tensors(8)
    m = [t.abs() * 0.1 for t in tensors(9)]
    v = [t.abs() * 0.01 for t in tensors(10)]
    decays = [0.0, 0.01, 0.05]
    expect = apex_lamb_reference(g, p, m, v, lr=0.02, beta1=0.9, beta2=0.999, eps=1e-6, step=4,
                                 bias_correction=True, wd=None, grad_averaging=True, mode=1,
                                 clip=2.0, decays=decays)
    noop = torch.zeros(1, dtype=torch.int32)
    updates = [torch.empty_like(t, dtype=torch.float16) for t in p]  # Apex allows another dtype
    # step 3: stage 1 corrects for step + 1, as Apex's kernel does; norm 4 > max 2: clip 2
    multi_tensor_applier(amp_C.multi_tensor_lamb_stage1_cuda, noop, [g, p, m, v, updates],
                         torch.tensor(decays), 3, 0.9, 0.999, 1e-6, torch.tensor([4.0]), 2.0)
    for a, b in zip(updates, expect[3]):
        assert_close(a, b.half(), rtol=1e-3, atol=1e-4)
    for got, want in zip((m, v), expect[1:3]):
        for a, b in zip(got, want):
            assert_close(a, b.float(), **F32)
    p_norms = torch.stack([t.norm() for t in p])
    u_norms = torch.stack([t.float().norm() for t in updates])
    p0 = [t.clone() for t in p]
    multi_tensor_applier(amp_C.multi_tensor_lamb_stage2_cuda, noop, [p, updates], p_norms, u_norms,
                         0.02, 0.01, False)
    for a, a0, u, pn, un in zip(p, p0, updates, p_norms, u_norms):
        ratio = 0.02 * float(pn) / float(un)  # weight_decay != 0: every tensor gets its ratio
        assert_close(a, (a0.double() - ratio * u.double()).float(), **F32)


def apex_novograd_loop(params, grads_per_step, *, lr, beta1, beta2, eps, wd, norm_type, mode,
                       grad_averaging=True, init_zero=False):
    """Apex's FusedNovoGrad.step over amp_C: grad_norms starts at the first grads' norms
    (or 0 with init_zero), then the kernel blends and updates it every step."""
    m = [torch.zeros_like(p) for p in params]
    noop = torch.zeros(1, dtype=torch.int32)
    grad_norms = None
    for step, grads in enumerate(grads_per_step, start=1):
        if grad_norms is None:
            norms = [g.norm(float("inf") if norm_type == 0 else 2) for g in grads]
            grad_norms = torch.zeros(len(grads)) if init_zero else torch.stack(norms).float()
        multi_tensor_applier(amp_C.multi_tensor_novograd, noop, [grads, params, m], grad_norms, lr,
                             beta1, beta2, eps, step, 1, wd, int(grad_averaging), mode, norm_type)
    return m, grad_norms


@pytest.mark.parametrize("norm_type", [2, 0])
@pytest.mark.parametrize("reg_inside_moment", [False, True])
def test_multi_tensor_novograd_steps_like_fused_novograd(norm_type, reg_inside_moment):
    start = tensors(11)
    grads_per_step = [tensors(20 + s) for s in range(5)]
    apex_params = [t.clone() for t in start]
    apex_novograd_loop(apex_params, grads_per_step, lr=0.01, beta1=0.95, beta2=0.98, eps=1e-8,
                       wd=0.001, norm_type=norm_type, mode=0 if reg_inside_moment else 1)
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    opt = FusedNovoGrad(ours, lr=0.01, betas=(0.95, 0.98), eps=1e-8, weight_decay=0.001,
                        norm_type=norm_type, reg_inside_moment=reg_inside_moment)
    for grads in grads_per_step:
        for q, g in zip(ours, grads):
            q.grad = g.clone()
        opt.step()
    for a, b in zip(apex_params, ours):
        assert_close(a, b.data, rtol=1e-5, atol=1e-7)


def test_multi_tensor_novograd_one_step_is_apex_formula():
    p0, g = tensors(12), tensors(13)
    m0 = [t * 0.1 for t in tensors(14)]
    prev = torch.tensor([0.5, 2.0, 1.5])
    p, m, grad_norms = [t.clone() for t in p0], [t.clone() for t in m0], prev.clone()
    multi_tensor_applier(amp_C.multi_tensor_novograd, torch.zeros(1, dtype=torch.int32), [g, p, m],
                         grad_norms, 0.1, 0.9, 0.99, 1e-8, 3, 1, 0.01, 1, 1, 2)
    for i in range(3):
        n = g[i].double().norm()
        gn = math.sqrt(0.99 * float(prev[i]) ** 2 + 0.01 * float(n) ** 2)
        assert float(grad_norms[i]) == pytest.approx(gn, rel=1e-6)
        denom = gn / math.sqrt(1 - 0.99 ** 3) + 1e-8
        md = 0.9 * m0[i].double() + 0.1 * g[i].double()
        upd = (md / (1 - 0.9 ** 3)) / denom + 0.01 * p0[i].double()
        assert_close(m[i], md.float(), **F32)
        assert_close(p[i], (p0[i].double() - 0.1 * upd).float(), **F32)


def test_adam_capturable_unscales_and_skips_on_noop():
    g, p0 = tensors(15), tensors(16)
    plain = [t.clone() for t in p0]
    m1, v1 = [torch.zeros_like(t) for t in p0], [torch.zeros_like(t) for t in p0]
    noop = torch.zeros(1, dtype=torch.int32)
    multi_tensor_applier(amp_C.multi_tensor_adam, noop, [g, plain, m1, v1], 0.01, 0.9, 0.999, 1e-8,
                         1, 1, 1, 0.01)
    cap = [t.clone() for t in p0]
    m2, v2 = [torch.zeros_like(t) for t in p0], [torch.zeros_like(t) for t in p0]
    lists = [[t * 256 for t in g], cap, m2, v2]
    args = (torch.tensor([0.01]), 0.9, 0.999, 1e-8, torch.tensor([1], dtype=torch.int32), 1, 1, 0.01,
            torch.tensor([1 / 256]))
    noop.fill_(1)
    multi_tensor_applier(amp_C.multi_tensor_adam_capturable, noop, lists, *args)
    assert all(torch.equal(a, b) for a, b in zip(cap, p0)) and all(not t.any() for t in m2)
    noop.zero_()
    multi_tensor_applier(amp_C.multi_tensor_adam_capturable, noop, lists, *args)
    for a, b in zip((*cap, *m2, *v2), (*plain, *m1, *v1)):
        assert torch.equal(a, b)  # a power-of-two scale unscales exactly

    half = [t.bfloat16() for t in p0]
    masters = [t.clone() for t in p0]
    m3, v3 = [torch.zeros_like(t) for t in p0], [torch.zeros_like(t) for t in p0]
    multi_tensor_applier(amp_C.multi_tensor_adam_capturable_master, noop,
                         [[t.bfloat16() * 256 for t in g], half, m3, v3, masters], *args)
    expect = [t.clone() for t in p0]
    multi_tensor_applier(amp_C.multi_tensor_adam, noop,
                         [[t.bfloat16().float() for t in g], expect, [torch.zeros_like(t) for t in p0],
                          [torch.zeros_like(t) for t in p0]], 0.01, 0.9, 0.999, 1e-8, 1, 1, 1, 0.01)
    for w, h, e in zip(masters, half, expect):
        assert torch.equal(w, e) and torch.equal(h, w.bfloat16())


def test_l2norm_scale_and_the_norm_flags():
    x = tensors(17)
    src = [t.clone() for t in x]
    noop = torch.zeros(1, dtype=torch.int32)
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm_scale, noop, [src, src], 0.5, True)
    assert_close(total, torch.cat([t.flatten() for t in x]).norm().reshape(1), rtol=1e-6, atol=0)
    assert_close(per, torch.stack([t.norm() for t in x]), rtol=1e-6, atol=0)
    assert all(torch.equal(a, b * 0.5) for a, b in zip(src, x)) and int(noop) == 0
    x[1][0] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_l2norm_scale, noop, [x, [torch.empty_like(t) for t in x]], 0.5)
    assert int(noop) == 1  # Apex sets the flag when a norm is not finite
    noop.zero_()
    multi_tensor_applier(amp_C.multi_tensor_l2norm, noop, [[torch.tensor([3e38, 3e38])]], False)
    assert int(noop) == 1  # finite values whose squares overflow: the norm is inf


def test_lamb_and_novograd_reject_bad_lists():
    with pytest.raises(ValueError, match="multi_tensor_lamb takes 4 tensor lists, got 3"):
        amp_C.multi_tensor_lamb(0, torch.zeros(1, dtype=torch.int32), [[], [], []], 0.1, 0.9, 0.999,
                                1e-6, 1, 1, 0.0, 1, 1, torch.ones(1), 1.0)
    with pytest.raises(ValueError, match="grad_norms holds 1 norms for 3 params"):
        amp_C.multi_tensor_novograd(0, torch.zeros(1, dtype=torch.int32),
                                    [tensors(0), tensors(1), tensors(2)], torch.ones(1), 0.1, 0.9,
                                    0.99, 1e-8, 1, 1, 0.0, 1, 1, 2)
    with pytest.raises(ValueError, match="per_tensor_decay holds 2 values for 3 params"):
        amp_C.multi_tensor_lamb_stage1_cuda(0, None, [tensors(0), tensors(1), tensors(2), tensors(3),
                                                      tensors(4)], torch.zeros(2), 1, 0.9, 0.999, 1e-6,
                                            torch.ones(1), 1.0)


def test_what_the_stand_ins_cannot_convert_reaches_the_op_which_names_it():
    # Each of these was converted or copied by the stand-in before the op saw it: a
    # uint8 grad became a float one, a bool momentum buffer was stepped in float32 and
    # written back, a sparse param and an expanded update met torch's own copy errors.
    noop = torch.zeros(1, dtype=torch.int32)
    p, m = [torch.ones(3), torch.ones(3)], [torch.zeros(3), torch.zeros(3)]
    with pytest.raises(TypeError, match=r"grads\[1\] has dtype torch.uint8"):
        amp_C.multi_tensor_sgd(0, noop, [[torch.ones(3), torch.ones(3, dtype=torch.uint8)], p, m], 0.0, 0.9, 0.0,
                               0.1, False, False, False, 1.0)
    with pytest.raises(TypeError, match=r"momentum_buffers\[1\] has dtype torch.float16 but "
                                        r"momentum_buffers\[0\] has torch.bool"):
        half = [[torch.ones(3, dtype=torch.half) for _ in range(2)] for _ in range(2)]
        amp_C.multi_tensor_sgd(0, noop, [*half, [torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.half)]],
                               0.0, 0.9, 0.0, 0.1, False, False, False, 1.0)
    with pytest.raises(TypeError, match=r"params\[1\] is a torch.sparse_coo tensor"):
        amp_C.multi_tensor_lamb_stage2_cuda(0, noop, [[torch.ones(3), torch.ones(3).to_sparse()],
                                                      [torch.ones(3), torch.ones(3)]],
                                            torch.ones(2), torch.ones(2), 0.1, 0.0, False)
    with pytest.raises(ValueError, match=r"updates\[0\] has elements that share memory"):
        amp_C.multi_tensor_lamb_stage1_cuda(0, noop, [[torch.ones(3)], [torch.ones(3)], [torch.zeros(3)],
                                                      [torch.zeros(3)], [torch.zeros(1).expand(3)]],
                                            torch.zeros(1), 1, 0.9, 0.999, 1e-6, 0.0, 1.0)


@pytest.mark.parametrize("norm_type", [2, 0])
def test_apex_fused_novograd_checkpoint_resumes_exactly(norm_type):
    """An Apex FusedNovoGrad checkpoint (layer norms and step in the param group, fp16
    norms first, then fp32) loads into core_ops' FusedNovoGrad, which then continues
    as Apex would have."""
    start = tensors(30)
    grads_per_step = [tensors(40 + s) for s in range(6)]
    hyper = dict(lr=0.01, beta1=0.95, beta2=0.98, eps=1e-8, wd=0.001, norm_type=norm_type, mode=1)
    apex_params = [t.clone() for t in start]
    m, grad_norms = apex_novograd_loop(apex_params, grads_per_step[:3], **hyper)
    apex_sd = {
        "state": {i: {"exp_avg": m[i].clone()} for i in range(3)},
        "param_groups": [{"lr": 0.01, "bias_correction": True, "betas": (0.95, 0.98), "eps": 1e-8,
                          "weight_decay": 0.001, "grad_averaging": True, "amsgrad": False,
                          "norm_type": norm_type, "init_zero": False, "step": 3, "params": [0, 1, 2],
                          "exp_avg_sq": [torch.zeros(0), grad_norms.clone()]}],
    }
    ours = [torch.nn.Parameter(t.clone()) for t in apex_params]
    opt = FusedNovoGrad(ours, lr=0.5, betas=(0.9, 0.9), norm_type=norm_type)
    opt.load_state_dict(apex_sd)
    assert "exp_avg_sq" not in opt.param_groups[0]

    # Apex continues its own loop from step 4 with the same state.
    noop = torch.zeros(1, dtype=torch.int32)
    for step, grads in enumerate(grads_per_step[3:], start=4):
        multi_tensor_applier(amp_C.multi_tensor_novograd, noop, [grads, apex_params, m], grad_norms,
                             0.01, 0.95, 0.98, 1e-8, step, 1, 0.001, 1, 1, norm_type)
        for q, g in zip(ours, grads):
            q.grad = g.clone()
        opt.step()
    for a, b in zip(apex_params, ours):
        assert_close(a, b.data, rtol=1e-5, atol=1e-7)
    assert all(float(opt.state[q]["step"]) == 6 for q in ours)


def test_apex_fused_novograd_checkpoint_with_unknown_norm_owners_is_rejected():
    ours = [torch.nn.Parameter(t) for t in tensors(31)]
    opt = FusedNovoGrad(ours)
    apex_sd = {"state": {0: {"exp_avg": torch.zeros(5, 3)}},
               "param_groups": [{**opt.param_groups[0], "params": [0, 1, 2], "step": 1,
                                 "exp_avg_sq": [torch.zeros(0), torch.ones(2)]}]}
    with pytest.raises(ValueError, match="holds 2 torch.float32 layer norms for 3 torch.float32 params"):
        opt.load_state_dict(apex_sd)
    assert not opt.state  # nothing half-loaded
