"""After a step given a grad scale, the grads hold the unscaled values the update used,
as torch's fused optimizers leave them (Note [Grads written back unscaled] in
csrc/include/core_ops/optimizer_args.h); a skipped step leaves them as they were.

Every fused optimizer of the registry (optimizer_registry.py, generic test
"grads_written_back", with its every_path kwargs: no clipping, so the written grads
are the unscaled ones), in every param dtype it takes, on the native kernels of each
device and on the reference kernels; torch.amp.GradScaler against torch's own
fused=True optimizers; core_ops' LossScaler; and the amp_C kernels that take a grad
scale.

Expected grads are computed as the kernels compute them: the scaled grad in the state
dtype, divided by the scale, rounded to the grad's dtype, so the comparisons are exact."""

import copy

import pytest
import torch
from optim_cases import DEVICES, assert_native
from optimizer_registry import cases, dtype_cases

from core_ops.amp import LossScaler
from core_ops.multi_tensor_apply import amp_C
from core_ops.optimizers import FusedAdam
from core_ops.reference import KERNELS as REF


def make_params(device, dtype):
    """A vector over three CPU chunks, an odd size, and a channels_last conv weight:
    its grad is contiguous, so the kernels work on a copy laid out as the param."""
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(2 * 16384 + 3, generator=g), torch.randn(17, generator=g),
          torch.randn(8, 3, 5, 5, generator=g).to(memory_format=torch.channels_last)]
    return [t.to(device, dtype).requires_grad_() for t in ts]


def scaled_grads(params, scale, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype) for p in params]


def unscaled(grad, scale):
    """grad / scale correctly rounded, as every kernel and torch's fused optimizers
    divide. Computed on the CPU: CUDA's ``tensor / python_float`` multiplies by the
    rounded reciprocal instead (ATen's div_true_kernel_cuda), an ulp off for a scale
    of 3, so an oracle computed there failed every exact comparison on the H200."""
    math = torch.float64 if grad.dtype == torch.float64 else torch.float32
    return (grad.cpu().to(math) / scale).to(grad.dtype).to(grad.device)


def backend(info, which, device, monkeypatch):
    """``info``'s every_path optimizer, on the native kernels of ``device`` or on the
    reference kernels."""
    if which == "reference":
        monkeypatch.setattr(info.module, "op", lambda name: REF[name])
    else:
        assert_native(device)
    return lambda ps, **kw: info.make(ps, info.every_path, **kw)


@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["native", "reference"])
@pytest.mark.parametrize("info,dtype", dtype_cases("grads_written_back"))
def test_grads_hold_the_unscaled_values_after_the_step(info, dtype, which, device, maximize, monkeypatch):
    make = backend(info, which, device, monkeypatch)
    params = make_params(device, dtype)
    opt = make(params, maximize=maximize)
    for seed, scale in ((1, 3.0), (2, 1024.0)):  # 3: a rounding in every dtype; 1024: exact
        grads = scaled_grads(params, scale, seed)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step(grad_scale=torch.tensor([scale], device=device))
        for p, g in zip(params, grads):
            assert p.grad.stride() == g.stride()  # the user's grad tensor, written in place
            assert torch.equal(p.grad, unscaled(g, scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["native", "reference"])
@pytest.mark.parametrize("info", cases("grads_written_back"))
def test_a_skipped_step_and_a_scale_of_one_leave_the_grads_alone(info, which, device, monkeypatch):
    make = backend(info, which, device, monkeypatch)
    params = make_params(device, info.typical.dtype)
    opt = make(params)
    grads = scaled_grads(params, 1024.0)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step(grad_scale=torch.tensor([1024.0], device=device), found_inf=torch.ones(1, device=device))
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))
    opt.step(grad_scale=torch.tensor([1.0], device=device))
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))


def test_clipping_leaves_the_grads_clipped_as_clip_grad_norm_does():
    params = make_params("cpu", torch.float32)
    opt = FusedAdam(params, lr=1e-2)
    grads = scaled_grads(params, 1024.0)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step(grad_scale=torch.tensor([1024.0]), max_grad_norm=1.0)
    twins = [torch.zeros_like(p).requires_grad_() for p in params]
    for t, g in zip(twins, grads):
        t.grad = g / 1024.0
    norm = torch.nn.utils.clip_grad_norm_(twins, 1.0)
    torch.testing.assert_close(opt.last_grad_norm, norm, rtol=1e-5, atol=0)
    for p, t in zip(params, twins):
        torch.testing.assert_close(p.grad, t.grad, rtol=1e-5, atol=1e-9)  # norms summed in another order


# torch's fused=True optimizers write the unscaled grads back too: the same run under
# torch.amp.GradScaler leaves the same grads, and an overflowed step leaves both alone.
# The grads, then the params (rtol, atol): a few ulps apart on the CPU; on a GPU torch's
# fused Adam rounds its betas to float32 first (Note [CUDA optimizer tolerances] in
# test_fused_adam.py), moving its updates by ~1e-5 relative.
AGAINST_TORCH_FUSED = {"cpu": (dict(rtol=1e-5, atol=1e-7), dict(rtol=1e-6, atol=1e-7)),
                       "cuda": (dict(rtol=1e-4, atol=1e-6), dict(rtol=1e-4, atol=1e-6))}


@pytest.mark.parametrize("info,config", cases("grads_written_back", "torch_counterpart", variants=True))
@pytest.mark.parametrize("device", DEVICES)
def test_grad_scaler_leaves_the_grads_as_torch_fused_leaves_them(device, info, config):
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)]
    models.append(copy.deepcopy(models[0]))
    opts = [info.make(list(models[0].parameters()), config),
            info.torch_optimizer(list(models[1].parameters()), **config.kwargs, fused=True)]
    scalers = [torch.amp.GradScaler(device, init_scale=2.0**10) for _ in models]
    x, y = torch.randn(16, 32, device=device), torch.randn(16, 4, device=device)
    for step in range(4):
        kept = []
        for model, opt, scaler in zip(models, opts, scalers):
            opt.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            if step == 2:  # an overflow: both skip and keep the scaled grads
                model[0].weight.grad[0, 0] = float("inf")
            before = [p.grad.clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            kept.append((before, [p.grad for p in model.parameters()]))
        (ours_before, ours), (theirs_before, theirs) = kept
        for a, b, was_a, was_b in zip(ours, theirs, ours_before, theirs_before):
            if step == 2:  # both skip and keep the scaled grads (torch 2.7's fused
                assert torch.equal(a, was_a)  # Adagrad unscaled them even then; 2.14's does not)
                assert torch.equal(b, was_b) or info.name == "adagrad"
            else:
                assert not torch.equal(a, was_a)  # unscaled
                torch.testing.assert_close(a, b, **AGAINST_TORCH_FUSED[device][0])
    assert scalers[0].get_scale() == scalers[1].get_scale() == 2.0**9
    for p, q in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(p, q, **AGAINST_TORCH_FUSED[device][1])


def test_loss_scaler_leaves_the_grads_unscaled():
    params = make_params("cpu", torch.bfloat16)
    opt = FusedAdam(params, lr=1e-2, master_weights=True)
    scaler = LossScaler(init_scale=2.0**12)
    grads = scaled_grads(params, 2.0**12)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(p.grad, unscaled(g, 2.0**12)) for p, g in zip(params, grads))
    grads[1][3] = float("nan")
    for p, g in zip(params, grads):
        p.grad = g.clone()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**11  # skipped: the grads are left scaled
    for p, g in zip(params, grads):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0, equal_nan=True)


# ---- amp_C: every kernel taking a grad scale (Apex's capturable Adam wrote the
# unscaled grads back; core_ops' kernels all do) ----------------------------------


def adam_lists(dtype=torch.float32, master=False):
    params = make_params("cpu", dtype)[:2]
    grads = scaled_grads(params, 8.0)
    lists = [[g.clone() for g in grads], [p.detach() for p in params],
             [torch.zeros_like(p, dtype=torch.float32) for p in params],
             [torch.zeros_like(p, dtype=torch.float32) for p in params]]
    if master:
        lists.append([p.detach().float() for p in params])
    return grads, lists


@pytest.mark.parametrize("kernel", ["multi_tensor_adam", "multi_tensor_adam_capturable",
                                    "multi_tensor_adam_capturable_master"])
def test_amp_C_adam_kernels_write_the_unscaled_grads_back(kernel):
    master = kernel.endswith("master")
    grads, lists = adam_lists(torch.float16 if master else torch.float32, master)
    noop = torch.zeros(1, dtype=torch.int32)
    lr, step = (torch.tensor(1e-3), torch.tensor(1)) if "capturable" in kernel else (1e-3, 1)
    getattr(amp_C, kernel)(2048 * 32, noop, lists, lr, 0.9, 0.999, 1e-8, step, 1, 1, 0.0,
                           torch.tensor(1 / 8.0))
    assert all(torch.equal(g, unscaled(s, 8.0)) for g, s in zip(lists[0], grads))


def test_amp_C_sgd_writes_the_unscaled_grads_back_in_their_own_dtype():
    params = make_params("cpu", torch.float32)[:2]
    grads = [g.half() for g in scaled_grads(params, 8.0)]  # fp16 grads of fp32 params
    lists = [[g.clone() for g in grads], [p.detach() for p in params],
             [torch.zeros_like(p) for p in params]]
    amp_C.multi_tensor_sgd(2048 * 32, torch.zeros(1, dtype=torch.int32), lists, 0.0, 0.9, 0.0,
                           0.1, False, True, False, 1 / 8.0)
    assert all(g.dtype == torch.float16 and torch.equal(g, (s.float() / 8.0).half())
               for g, s in zip(lists[0], grads))


def test_amp_C_lamb_mp_writes_the_unscaled_grads_back():
    grads, lists = adam_lists()
    amp_C.multi_tensor_lamb_mp(2048 * 32, torch.zeros(1, dtype=torch.int32), lists, torch.tensor(1e-3),
                               0.9, 0.999, 1e-6, torch.tensor(1), 1, 0.0, 1, 1, torch.tensor(1.0),
                               torch.tensor(1e9), False, torch.zeros(1), torch.tensor(1 / 8.0))
    assert all(torch.equal(g, unscaled(s, 8.0)) for g, s in zip(lists[0], grads))
