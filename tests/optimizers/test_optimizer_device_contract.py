"""What every fused optimizer promises on every device, written once for all of them
(optimizer_registry.py, generic test "device_contract", with each entry's every_path
kwargs: every path of its kernel, no clipping) and parametrized by device
(test_optimizer_contract.py holds the promises as a torch.optim.Optimizer; the
per-optimizer files keep their own numerics against torch):

- a step given a set found_inf (float or int32) changes nothing: params, masters,
  state, step counts, grads; the flag is read on the device, never written;
- grad_scale divides the grads on the device: a power-of-two scale gives bit for bit
  the unscaled run, and the grads are written back unscaled;
- half params with fp32 masters step as float32 params of the same values: bit for
  bit on the CPU (the same math on the same float32 values); on a GPU within the
  entry's ``across_devices`` (a half list's norms may be summed in another order than
  a float32 list's), and as the CPU kernel's masters;
- each device's kernel against its oracle, the kernels one level down, in fp64 and
  with grad_scale 3 in fp32, over 20 steps: on a GPU the CPU kernel (Note below), on
  the CPU the reference kernels of core_ops.reference (each entry's
  ``against_reference``).

Note [CUDA against CPU kernels]: both libraries run the same math header with every
* and + rounded once (-ffp-contract=off on the CPU, -fmad=false for nvcc: native/build.py),
IEEE division and sqrt, and coefficients computed in double and rounded once. Adam,
SGD and Adagrad are then equal bit for bit on the two devices. LAMB and NovoGrad read
per-tensor norms, which the GPU sums in another order (its blocks, not the CPU's
vector lanes): a few ulps a step, hence 12 float32 ulps of the largest |value| after
20 steps, and 1e-10 relative in fp64 (each entry's ``across_devices``).
"""

import dataclasses

import pytest
import torch
from optim_cases import (DEVICE_SIZES, DEVICES, SIZES, STEPS, assert_unchanged, below, clone_params, make_grads,
                         make_params, run, snapshot, ulps_close)
from optim_cases import native_kernels  # noqa: F401  (autouse)
from optimizer_registry import cases

from core_ops.multi_tensor_apply import ops as multi_tensor_ops

DEVICE_CONTRACT = cases("device_contract")


def make(info, params, **kw):
    return info.make(params, info.every_path, **kw)


@pytest.mark.parametrize("info", DEVICE_CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_found_inf_skips_everything(device, info):
    sizes = (17, 300, 65536 + 1)  # the last one spans chunks
    params = make_params(torch.bfloat16, sizes=sizes, device=device)
    opt = make(info, params, master_weights=True)
    grads = make_grads(sizes=sizes, steps=3)
    run(opt, params, grads[:2])
    before = snapshot(opt, params)
    for flag in (torch.ones(1, device=device), torch.ones(1, dtype=torch.int32, device=device)):
        run(opt, params, grads[2:], found_inf=flag, grad_scale=torch.tensor([4.0], device=device))
        assert_unchanged(before, opt, params)  # steps and masters included
        assert all(torch.equal(p.grad.cpu(), g.to(p.dtype)) for p, g in zip(params, grads[2]))  # not unscaled
        assert flag.item() == 1  # read, never written
    run(opt, params, grads[2:], found_inf=torch.zeros(1, device=device))
    assert all(opt.state[p].get("step", torch.tensor(3.0)).item() == 3 for p in params)
    assert not torch.equal(params[2].detach(), before[0][2])


@pytest.mark.parametrize("info", DEVICE_CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_grad_scale_divides_grads_on_the_device(device, info):
    sizes = (1000, 70000)
    a, b = make_params(sizes=sizes, device=device), make_params(sizes=sizes, device=device)
    oa, ob = make(info, a), make(info, b)
    for step_grads in make_grads(sizes=sizes, steps=2):
        for p, q, g in zip(a, b, step_grads):
            p.grad, q.grad = (g * 1024).to(device), g.to(device)
        oa.step(grad_scale=torch.tensor([1024.0], device=device))  # a power of two: exact
        ob.step()
        for p, q, g in zip(a, b, step_grads):
            assert torch.equal(p.grad.cpu(), g)  # written back unscaled
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())


def oracle_run(device, info, monkeypatch, dtype, grad_scale=None, **kwargs):
    """((optimizer, params) of the device's run, of its oracle's run, the tolerance
    between them): ``info``'s every_path optimizer (and ``kwargs``) for STEPS steps. On
    a GPU the oracle is the CPU kernel (``across_devices``), on the CPU the reference
    kernels of core_ops.reference, norms included (``against_reference``), over sizes
    that straddle the CPU's chunk only (the reference is slow)."""
    sizes = SIZES if device == "cpu" else DEVICE_SIZES

    def one(on):
        params = make_params(dtype, sizes=sizes, device=on)
        opt = make(info, params, **kwargs)
        scale = None if grad_scale is None else torch.tensor([grad_scale], device=on)
        run(opt, params, make_grads(sizes=sizes, dtype=dtype), grad_scale=scale)
        return opt, params

    ours = one(device)
    return ours, one(below(device, monkeypatch, info.module, multi_tensor_ops)), (
        info.across_devices if device != "cpu" else info.against_reference)


def assert_agree(tolerance, tensor, expected, fp64=False):
    if tolerance.ulps == 0:
        assert torch.equal(tensor.detach().cpu(), expected.detach())
    elif fp64:
        torch.testing.assert_close(tensor.detach().cpu(), expected.detach(), rtol=1e-10, atol=1e-12)
    else:
        ulps_close(tensor, expected, tolerance.ulps)


@pytest.mark.parametrize("info", cases("device_contract", "float64"))
@pytest.mark.parametrize("device", DEVICES)
def test_fp64_kernel_matches_its_oracle(device, info, monkeypatch):
    (_, ours), (_, oracle), tolerance = oracle_run(device, info, monkeypatch, torch.float64)
    for a, c in zip(ours, oracle):
        assert_agree(tolerance, a, c, fp64=True)


@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("info", DEVICE_CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_grad_scale_kernel_matches_its_oracle(device, info, maximize, monkeypatch):
    # grad_scale 3: a rounding in every division.
    (og, ours), (oc, oracle), tolerance = oracle_run(device, info, monkeypatch, torch.float32,
                                                     grad_scale=3.0, maximize=maximize)
    for a, c in zip(ours, oracle):
        assert_agree(tolerance, a, c)
        assert_agree(tolerance, a.grad, c.grad)  # the unscaled grads written back
        for key, value in og.state[a].items():
            if key != "step":
                assert_agree(tolerance, value, oc.state[c][key])
        assert og.state[a].get("step", torch.tensor(float(STEPS))).item() == STEPS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("info", DEVICE_CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_master_weights_follow_the_fp32_run(device, info, dtype):
    ours = make_params(dtype, sizes=DEVICE_SIZES, device=device)
    fp32 = clone_params(ours, torch.float32)  # the same rounded start
    grads = make_grads(sizes=DEVICE_SIZES, dtype=dtype)  # the fp32 run is fed the same values
    scale = dict(grad_scale=torch.tensor([3.0], device=device))
    opt, ref = make(info, ours, master_weights=True), make(info, fp32)
    run(opt, ours, grads, **scale)
    run(ref, fp32, grads, dtype=torch.float32, **scale)
    tolerance = info.across_devices if device != "cpu" else dataclasses.replace(info.across_devices, ulps=0)
    for a, b in zip(ours, fp32):
        master = opt.state[a]["master_param"]
        assert master.dtype == torch.float32 and master.device == a.device
        assert_agree(tolerance, master, b.detach().cpu())
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded
        for key, value in ref.state[b].items():
            assert opt.state[a][key].dtype == torch.float32
            assert_agree(tolerance, opt.state[a][key], value.cpu())
    if device == "cpu":
        return
    cpu = make_params(dtype, sizes=DEVICE_SIZES)
    on_cpu = make(info, cpu, master_weights=True)
    run(on_cpu, cpu, grads, grad_scale=torch.tensor([3.0]))
    for a, c in zip(ours, cpu):
        for key, value in on_cpu.state[c].items():
            assert_agree(info.across_devices, opt.state[a][key], value)
