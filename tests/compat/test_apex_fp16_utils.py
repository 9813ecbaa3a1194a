"""Apex's ``fp16_utils`` (``import apex.fp16_utils``): the half-model helpers, the master
param copies, the legacy loss scalers and ``FP16_Optimizer``, against hand-written
fp32-master loops doing the same arithmetic (so bit for bit)."""

import copy
import math

import pytest
import torch
from torch import nn

import core_ops.compat.apex  # noqa: F401  (installs the alias finder)
from apex.fp16_utils import (
    BN_convert_float,
    DynamicLossScaler,
    FP16_Optimizer,
    FP16Model,
    LossScaler,
    clip_grad_norm,
    master_params_to_model_params,
    model_grads_to_master_grads,
    network_to_half,
    prep_param_lists,
    to_python_float,
)
from core_ops.optimizers import FusedAdam


def conv_bn_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.BatchNorm2d(3), nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def half_mlp(seed=0, dtype=torch.float16):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(n)]


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x.to(model[0].weight.dtype)).float(), y)


# ---- the model helpers ----------------------------------------------------------------

def test_fp16_model_keeps_affine_batchnorm_float_and_returns_half():
    model = FP16Model(conv_bn_net())
    net = model.network
    for m in model.modules():
        want = torch.float32 if m in (net[0],) else torch.float16  # net[2] is not affine: half
        assert all(p.dtype == want for p in m.parameters(recurse=False))
        assert all(b.dtype in (want, torch.int64) for b in m.buffers(recurse=False))
    assert net[2].running_mean.dtype == torch.float16
    out = model(torch.randn(2, 3, 8, 8))
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


def test_fp16_model_passes_integer_inputs_as_they_are():
    model = FP16Model(nn.Embedding(10, 4))
    assert model(torch.tensor([1, 2, 9])).dtype == torch.float16


def test_network_to_half_casts_its_input_and_bn_convert_float():
    model = network_to_half(conv_bn_net())
    assert model[1][0].weight.dtype == torch.float32 and model[1][1].weight.dtype == torch.float16
    assert model(torch.randn(2, 3, 8, 8)).dtype == torch.float16
    assert BN_convert_float(nn.Sequential(nn.BatchNorm1d(2).half()))[0].weight.dtype == torch.float32


@pytest.mark.parametrize("flat", [False, True])
def test_master_param_lists_round_trip(flat):
    model = half_mlp()
    model_params, masters = prep_param_lists(model, flat_master=flat)
    assert len(masters) == (1 if flat else 4) and all(m.dtype == torch.float32 and m.requires_grad for m in masters)
    loss_of(model, *batches(1)[0]).backward()
    model_grads_to_master_grads(model_params, masters, flat_master=flat)
    got = masters[0].grad if flat else torch.cat([m.grad.flatten() for m in masters])
    assert torch.equal(got, torch.cat([p.grad.float().flatten() for p in model_params]))
    with torch.no_grad():
        for m in masters:
            m.add_(0.25)
    master_params_to_model_params(model_params, masters, flat_master=flat)
    want = masters[0] if flat else torch.cat([m.flatten() for m in masters])
    assert torch.equal(torch.cat([p.flatten() for p in model_params]), want.half())


def test_flat_masters_refuse_mixed_dtypes():
    model = nn.Sequential(nn.Linear(2, 2).half(), nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"flat_master=True\) needs params of one dtype"):
        prep_param_lists(model, flat_master=True)


def test_to_python_float():
    assert to_python_float(torch.tensor(2.5)) == 2.5 and to_python_float([3.0]) == 3.0


def test_clip_grad_norm_matches_torch():
    grads = [torch.randn(5, 3) * 4, torch.randn(7), torch.randn(2, 2).half()]
    mine = [torch.zeros_like(g, requires_grad=True) for g in grads]
    theirs = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, q, g in zip(mine, theirs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    norm = clip_grad_norm(mine, 1.5)
    torch_norm = torch.nn.utils.clip_grad_norm_(theirs, 1.5)
    # The same sum of squares in another order (multi-tensor chunks): float32 rounding.
    torch.testing.assert_close(norm, torch_norm, rtol=1e-6, atol=0)
    for p, q in zip(mine, theirs):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-6 if p.dtype == torch.float32 else 1e-3, atol=0)
    inf = torch.zeros(3, requires_grad=True)
    inf.grad = torch.tensor([1.0, math.inf, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm([inf], 1.0, error_if_nonfinite=True)
    assert torch.equal(inf.grad, torch.tensor([1.0, math.inf, 0.0]))  # nothing scaled before the error


# ---- the legacy loss scalers ----------------------------------------------------------

def test_dynamic_loss_scaler_halves_on_overflow_and_grows_after_its_window():
    scaler = DynamicLossScaler(init_scale=2.0**10, scale_factor=2.0, scale_window=3)
    p = torch.zeros(2, requires_grad=True)
    p.grad = torch.tensor([1.0, float("nan")])
    assert scaler.has_overflow([p]) and DynamicLossScaler._has_inf_or_nan(p.grad)
    p.grad = torch.ones(2)
    assert not scaler.has_overflow([p])
    seen = []
    for overflow in [True, False, False, False, True, True]:
        scaler.update_scale(overflow)
        seen.append(scaler.loss_scale)
    # iter 0 overflows (512); iters 1-3 are 1, 2, 3 after it: the window of 3 closes at 3.
    assert seen == [512, 512, 512, 1024, 512, 256]
    static = LossScaler(128)
    assert static.loss_scale == 128 and not static.has_overflow([p])


# ---- FP16_Optimizer --------------------------------------------------------------------

def reference_run(model, make_opt, data, scale):
    """Apex's recipe written out: fp32 masters, backward on loss * scale, master grad =
    half grad * (1 / scale), step the masters, copy them back."""
    halves = list(model.parameters())
    masters = [p.detach().float().requires_grad_() for p in halves]
    opt = make_opt(masters)
    for x, y in data:
        for p in halves:
            p.grad = None
        (loss_of(model, x, y) * scale).backward()
        for p, m in zip(halves, masters):
            m.grad = p.grad.float() * (1.0 / scale)
        opt.step()
        with torch.no_grad():
            for p, m in zip(halves, masters):
                p.copy_(m)
    return halves, masters


def fp16_run(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        opt.backward(loss_of(model, x, y))
        opt.step()


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "fused_adam": lambda params: FusedAdam(params, lr=1e-2, weight_decay=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp16_optimizer_matches_the_recipe_bit_for_bit(name, dtype):
    data = batches(4)
    ref_model, model = half_mlp(dtype=dtype), half_mlp(dtype=dtype)
    ref_halves, ref_masters = reference_run(ref_model, OPTIMIZERS[name], data, scale=128.0)
    opt = FP16_Optimizer(OPTIMIZERS[name](model.parameters()), static_loss_scale=128.0, verbose=False)
    fp16_run(model, opt, data)
    for p, q in zip(model.parameters(), ref_halves):
        assert p.dtype == dtype and torch.equal(p, q)
    for m, r in zip(opt.fp32_from_fp16_groups[0], ref_masters):
        assert torch.equal(m, r)
    assert opt.param_groups[0]["params"][0] is opt.fp32_from_fp16_groups[0][0]


def test_float32_params_are_stepped_in_place():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 3).half(), nn.Linear(3, 3))
    ref = copy.deepcopy(model)
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=4.0, verbose=False)
    ref_opt = torch.optim.SGD(ref[1].parameters(), lr=0.1)
    x = torch.randn(4, 8).half()
    def loss(m):
        return m[1](m[0](x).float()).square().mean()
    opt.backward(loss(model))
    (loss(ref) * 4.0).backward()
    for p in ref[1].parameters():
        p.grad /= 4.0
    ref_opt.step()
    opt.step()
    assert opt.fp32_from_fp32_groups[0] == list(model[1].parameters())
    for p, q in zip(model[1].parameters(), ref[1].parameters()):
        assert torch.equal(p, q)


def snapshot(model, opt):
    return (copy.deepcopy([p.detach() for p in model.parameters()]),
            copy.deepcopy([m.detach() for g in opt.fp32_from_fp16_groups for m in g]),
            copy.deepcopy(opt.optimizer.state_dict()["state"]))


def assert_same(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert torch.equal(x, y)
    assert a[2].keys() == b[2].keys()
    for k in a[2]:
        for name in a[2][k]:
            assert torch.equal(torch.as_tensor(a[2][k][name]), torch.as_tensor(b[2][k][name]))


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_an_overflow_skips_the_step_and_leaves_everything_untouched(dynamic):
    model = half_mlp()
    opt = FP16_Optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), static_loss_scale=64.0,
                         dynamic_loss_scale=dynamic, dynamic_loss_args={"init_scale": 2.0**10} if dynamic else None,
                         verbose=False)
    x, y = batches(1)[0]
    fp16_run(model, opt, [(x, y)])
    before = snapshot(model, opt)
    opt.zero_grad()
    opt.backward(loss_of(model, x, y) * math.inf)
    assert opt.overflow and opt.clip_master_grads(1.0) == -1 and opt.inspect_master_grad_data() is None
    assert opt.step() is None
    assert_same(before, snapshot(model, opt))
    assert opt.loss_scale == (2.0**9 if dynamic else 64.0)
    fp16_run(model, opt, [(x, y)])  # the next clean step goes ahead
    assert not opt.overflow
    assert not torch.equal(before[0][0], model[0].weight)


def test_dynamic_scale_grows_after_its_window():
    model = half_mlp()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.01), dynamic_loss_scale=True,
                         dynamic_loss_args={"init_scale": 8.0, "scale_window": 2, "scale_factor": 4.0},
                         verbose=False)
    scales = []
    for x, y in batches(4):
        fp16_run(model, opt, [(x, y)])
        scales.append(opt.loss_scale)
    assert scales == [8.0, 32.0, 32.0, 128.0]


def test_clip_master_grads_returns_the_unscaled_norm():
    model = half_mlp()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=1024.0, verbose=False)
    x, y = batches(1)[0]
    opt.backward(loss_of(model, x, y))
    true = torch.cat([m.grad.flatten() for m in opt.fp32_from_fp16_groups[0]]).norm()
    norm = opt.clip_master_grads(true.item() / 2)
    torch.testing.assert_close(norm, true, rtol=1e-6, atol=0)  # float32 sums in another order
    clipped = torch.cat([m.grad.flatten() for m in opt.fp32_from_fp16_groups[0]]).norm()
    torch.testing.assert_close(clipped, true / 2, rtol=1e-5, atol=0)
    grads = opt.inspect_master_grad_data()
    assert len(grads) == 1 and len(grads[0]) == 4 and grads[0][0].dtype == torch.float32


def test_several_losses_per_step_with_update_master_grads_false():
    data = batches(2)
    model, ref = half_mlp(), half_mlp()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=8.0, verbose=False)
    opt.backward(loss_of(model, *data[0]), update_master_grads=False)
    opt.backward(loss_of(model, *data[1]), update_master_grads=False)
    opt.update_master_grads()
    ((loss_of(ref, *data[0]) + loss_of(ref, *data[1])) * 8.0).backward()  # half grads accumulate alike
    for m, p in zip(opt.fp32_from_fp16_groups[0], ref.parameters()):
        assert torch.equal(m.grad, p.grad.float() * (1.0 / 8.0))


def test_checkpoint_resumes_exactly():
    data = batches(6)
    whole = half_mlp()
    whole_opt = FP16_Optimizer(torch.optim.Adam(whole.parameters(), lr=1e-2), dynamic_loss_scale=True, verbose=False)
    fp16_run(whole, whole_opt, data)

    first = half_mlp()
    first_opt = FP16_Optimizer(torch.optim.Adam(first.parameters(), lr=1e-2), dynamic_loss_scale=True, verbose=False)
    fp16_run(first, first_opt, data[:3])
    saved = copy.deepcopy({"model": first.state_dict(), "optimizer": first_opt.state_dict()})
    resumed = half_mlp(seed=9)
    resumed_opt = FP16_Optimizer(torch.optim.Adam(resumed.parameters(), lr=1e-2), dynamic_loss_scale=True,
                                 verbose=False)
    resumed.load_state_dict(saved["model"])
    resumed_opt.load_state_dict(saved["optimizer"])
    fp16_run(resumed, resumed_opt, data[3:])
    assert_same(snapshot(whole, whole_opt), snapshot(resumed, resumed_opt))
    assert resumed_opt.loss_scale == whole_opt.loss_scale


def test_a_closure_is_retried_with_a_lower_scale_after_an_overflow():
    model = half_mlp()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True, verbose=False)
    x, y = batches(1)[0]
    calls = []

    def closure():
        opt.zero_grad()
        loss = loss_of(model, x, y) * (math.inf if not calls else 1.0)
        calls.append(opt.loss_scale)
        opt.backward(loss)
        return loss

    before = model[0].weight.clone()
    opt.step(closure)
    assert calls == [2.0**16, 2.0**15] and not torch.equal(before, model[0].weight)
    static = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=2.0, verbose=False)

    def bad():
        static.zero_grad()
        loss = loss_of(model, x, y) * math.inf
        static.backward(loss)
        return loss

    with pytest.raises(RuntimeError, match="static loss scale"):
        static.step(bad)


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="param 0 of param group 0 is torch.float64"):
        FP16_Optimizer(torch.optim.SGD([nn.Parameter(torch.zeros(2, dtype=torch.float64))], lr=0.1))
    with pytest.raises(TypeError, match=r"dynamic_loss_args: unknown keys \['growth'\]"):
        FP16_Optimizer(torch.optim.SGD(half_mlp().parameters(), lr=0.1), dynamic_loss_scale=True,
                       dynamic_loss_args={"growth": 2})
    with pytest.raises(ValueError, match="static_loss_scale must be a finite number > 0"):
        FP16_Optimizer(torch.optim.SGD(half_mlp().parameters(), lr=0.1), static_loss_scale=0)
    opt = FP16_Optimizer(torch.optim.SGD(half_mlp().parameters(), lr=0.1), verbose=False)
    with pytest.raises(RuntimeError, match="serialized using state_dict"):
        copy.deepcopy(opt)


def test_zero_grad_keeps_bucket_view_grads():
    """DDP's grads are views of its buckets (gradient_as_bucket_view); they are zeroed
    in place, not detached (which a view refuses), and stay views."""
    model = half_mlp()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)
    bucket = torch.ones(sum(p.numel() for p in model.parameters()), dtype=torch.float16)
    offset = 0
    for p in model.parameters():
        p.grad = bucket[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    opt.zero_grad()
    assert torch.equal(bucket, torch.zeros_like(bucket))
    assert all(p.grad._base is bucket for p in model.parameters())
