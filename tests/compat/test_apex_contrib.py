"""The parts of ``apex.contrib`` that public code imports: clip_grad_norm_, FastLayerNorm
and FastLayerNormFN, and the pre-amp optimizers (FusedAdam, FusedSGD, FusedLAMB) with
contrib's FP16_Optimizer, against torch and hand-written fp32-master loops."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import core_ops.compat.apex  # noqa: F401  (installs the alias finder)
from apex.contrib.clip_grad import clip_grad_norm_
from apex.contrib.layer_norm import FastLayerNorm
from apex.contrib.layer_norm.layer_norm import FastLayerNormFN
from apex.contrib.optimizers import FP16_Optimizer, FusedAdam, FusedLAMB, FusedSGD


def test_clip_grad_norm_is_torchs_on_the_multi_tensor_norm():
    params = [torch.zeros(9, requires_grad=True), torch.zeros(3, 3, requires_grad=True)]
    twins = [torch.zeros_like(p, requires_grad=True) for p in params]
    for p, q in zip(params, twins):
        p.grad = torch.randn(p.shape) * 3
        q.grad = p.grad.clone()
    norm = clip_grad_norm_(params, 0.5)
    torch.testing.assert_close(norm, torch.nn.utils.clip_grad_norm_(twins, 0.5), rtol=1e-6, atol=0)
    for p, q in zip(params, twins):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-6, atol=0)  # float32 sums in another order
    assert float(clip_grad_norm_(params, 1.0, norm_type=math.inf)) == float(torch.cat(
        [p.grad.flatten() for p in params]).abs().max())
    assert clip_grad_norm_([torch.zeros(2, requires_grad=True)], 1.0).item() == 0.0


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_fast_layer_norm_equals_torch(memory_efficient):
    torch.manual_seed(0)
    ln = FastLayerNorm(32, eps=1e-5, memory_efficient=memory_efficient)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.normal_()
    ref = nn.LayerNorm(32, eps=1e-5)
    ref.load_state_dict(ln.state_dict())
    x = torch.randn(4, 6, 32, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = ln(x), ref(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=2e-6)  # float32, another order of sums
    dy = torch.randn_like(y)
    y.backward(dy)
    y_ref.backward(dy)
    for got, want in [(x.grad, x_ref.grad), (ln.weight.grad, ref.weight.grad), (ln.bias.grad, ref.bias.grad)]:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fast_layer_norm_memory_efficient_keeps_the_output_not_the_input():
    x = torch.randn(8, 16, requires_grad=True)
    w, b = torch.ones(16, requires_grad=True), torch.zeros(16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = FastLayerNormFN.apply(x, w, b, 1e-5, True)
    assert not any(t is x or (t.data_ptr() == x.data_ptr()) for t in saved)
    assert any(t.data_ptr() == y.data_ptr() for t in saved)


def test_fast_layer_norm_under_autocast_runs_in_its_dtype():
    ln = FastLayerNorm(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ln(torch.randn(3, 16))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert ln.weight.grad.dtype == torch.float32


def old_adam(p, g, state, lr, b1, b2, eps, wd, step):
    """Apex's pre-amp Adam (eps outside the root, bias correction in the step size)."""
    state["m"] = b1 * state.get("m", torch.zeros_like(p)) + (1 - b1) * g
    state["v"] = b2 * state.get("v", torch.zeros_like(p)) + (1 - b2) * g * g
    size = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
    return p - size * (state["m"] / (state["v"].sqrt() + eps) + wd * p)


def test_contrib_fused_adam_follows_its_formula():
    torch.manual_seed(0)
    p = torch.randn(20, dtype=torch.float64, requires_grad=True)
    opt = FusedAdam([p], lr=1e-2, weight_decay=0.1, eps=1e-6)
    want, state = p.detach().clone(), {}
    for step in range(1, 4):
        p.grad = torch.randn(20, dtype=torch.float64)
        want = old_adam(want, p.grad, state, 1e-2, 0.9, 0.999, 1e-6, 0.1, step)
        opt.step()
    torch.testing.assert_close(p.detach(), want, rtol=1e-13, atol=1e-13)  # float64, the same formula


def half_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)).half()


def data(n=4):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 6, generator=g).half(), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]


def reference(model, make, batches, scale):
    """fp32 masters stepped by the same optimizer on grads pre-divided by the scale."""
    masters = [p.detach().float() for p in model.parameters()]
    opt = make(masters)
    for x, y in batches:
        model.zero_grad()
        (F.cross_entropy(model(x).float(), y) * scale).backward()
        grads = [p.grad.float() / scale for p in model.parameters()]
        if isinstance(opt, FusedSGD):
            opt.step(grads=grads, output_params=list(model.parameters()), scale=1.0)
        else:
            for m, g in zip(masters, grads):
                m.grad = g
            opt.step()
            with torch.no_grad():
                for p, m in zip(model.parameters(), masters):
                    p.copy_(m)
    return masters


MAKERS = {"adam": lambda ps: FusedAdam(ps, lr=1e-2), "sgd": lambda ps: FusedSGD(ps, lr=0.1, momentum=0.9)}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_contrib_fp16_optimizer_matches_the_recipe(name):
    batches = data()
    ref_model, model = half_net(), half_net()
    masters = reference(ref_model, MAKERS[name], batches, 128.0)
    opt = FP16_Optimizer(MAKERS[name](model.parameters()), static_loss_scale=128.0, verbose=False)
    for x, y in batches:
        opt.zero_grad()
        opt.backward(F.cross_entropy(model(x).float(), y))
        opt.step()
    # The grads' division happens inside the kernel here and before it in the reference.
    # Adam's kernel divides the same numbers alike (bit for bit); SGD's takes another
    # code path for half grads whose float32 rounding differs: measured, one ulp at one
    # element of 252 after a step (the half-grad result was the nearer to float64).
    if name == "adam":
        for a, b in zip(opt.fp32_groups[0] + list(model.parameters()), masters + list(ref_model.parameters())):
            assert torch.equal(a, b)
    else:
        for m, r in zip(opt.fp32_groups[0], masters):
            torch.testing.assert_close(m, r, rtol=1e-6, atol=1e-7)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


def test_contrib_fp16_optimizer_skips_an_overflow_and_resumes_exactly():
    batches = data(6)
    model = half_net()
    opt = FP16_Optimizer(FusedAdam(model.parameters(), lr=1e-2), dynamic_loss_scale=True, verbose=False)
    x, y = batches[0]
    opt.zero_grad()
    opt.backward(F.cross_entropy(model(x).float(), y) * math.inf)
    before = [p.clone() for p in model.parameters()]
    opt.step()
    assert opt.cur_scale == 2**15 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not opt.optimizer.state  # no moment was made

    def run(model, opt, batches):
        for x, y in batches:
            opt.zero_grad()
            opt.backward(F.cross_entropy(model(x).float(), y))
            opt.step()

    whole = half_net()
    whole_opt = FP16_Optimizer(FusedAdam(whole.parameters(), lr=1e-2), dynamic_loss_scale=True, verbose=False)
    run(whole, whole_opt, batches)
    first = half_net()
    first_opt = FP16_Optimizer(FusedAdam(first.parameters(), lr=1e-2), dynamic_loss_scale=True, verbose=False)
    run(first, first_opt, batches[:3])
    saved = copy.deepcopy((first.state_dict(), first_opt.state_dict()))
    resumed = half_net(seed=5)
    resumed_opt = FP16_Optimizer(FusedAdam(resumed.parameters(), lr=1e-2), dynamic_loss_scale=True, verbose=False)
    resumed.load_state_dict(saved[0])
    resumed_opt.load_state_dict(saved[1])
    run(resumed, resumed_opt, batches[3:])
    for a, b in zip(list(whole.parameters()) + whole_opt.fp32_groups[0],
                    list(resumed.parameters()) + resumed_opt.fp32_groups[0]):
        assert torch.equal(a, b)


def test_contrib_fused_sgd_needs_the_wrapper_and_fused_lamb_is_core_ops():
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.ones(3)
    with pytest.raises(RuntimeError, match="must be wrapped with apex.contrib.optimizers.FP16_Optimizer"):
        FusedSGD([p], lr=0.1).step()
    from core_ops.optimizers import FusedLAMB as CoreLAMB
    assert FusedLAMB is CoreLAMB
    with pytest.raises(ValueError, match=r"2 lists for 1 param groups"):
        FusedAdam([p]).step(grads=[[p.grad], [p.grad]])
