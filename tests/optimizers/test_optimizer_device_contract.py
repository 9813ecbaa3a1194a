"""What every fused optimizer promises on every device, written once for all five and
parametrized by device (test_optimizer_contract.py holds the device-free promises;
the per-optimizer files keep their own numerics against torch):

- a step given a set found_inf (float or int32) changes nothing: params, masters,
  state, step counts, grads; the flag is read on the device, never written;
- grad_scale divides the grads on the device: a power-of-two scale gives bit for bit
  the unscaled run, and the grads are written back unscaled;
- on a GPU, the CUDA kernel against the CPU kernel, in fp64 and with grad_scale 3 in
  fp32, over 20 steps.

Note [CUDA against CPU kernels]: both libraries run the same math header with every
* and + rounded once (-ffp-contract=off on the CPU, -fmad=false for nvcc: _build.py),
IEEE division and sqrt, and coefficients computed in double and rounded once. Adam,
SGD and Adagrad are then equal bit for bit on the two devices. LAMB and NovoGrad read
per-tensor norms, which the GPU sums in another order (its blocks, not the CPU's
vector lanes): a few ulps a step, hence 12 float32 ulps of the largest |value| after
20 steps, and 1e-10 relative in fp64.
"""

import pytest
import torch
from cuda_cases import STEPS, assert_unchanged, make_grads, make_params, run, snapshot, ulps_close

from core_ops import _build
from core_ops.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedNovoGrad, FusedSGD

MAKERS = {
    "adam": lambda ps, **kw: FusedAdam(ps, lr=1e-2, weight_decay=0.1, amsgrad=True, **kw),
    "sgd": lambda ps, **kw: FusedSGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.1, **kw),
    "adagrad": lambda ps, **kw: FusedAdagrad(ps, lr=1e-2, weight_decay=0.1, lr_decay=0.01, **kw),
    # No clipping: a clipped step divides by a norm summed in a device's own order.
    "lamb": lambda ps, **kw: FusedLAMB(ps, lr=1e-2, weight_decay=0.1, max_grad_norm=0.0, **kw),
    "novograd": lambda ps, **kw: FusedNovoGrad(ps, lr=5e-2, weight_decay=0.1, **kw),
}
KINDS = list(MAKERS)
BIT_EXACT_ACROSS_DEVICES = {"adam", "sgd", "adagrad"}  # Note above
NORM_ULPS = 12



def native(device):
    backend = _build.ensure(device)
    assert backend.native, backend.reason


@pytest.mark.parametrize("kind", KINDS)
def test_found_inf_skips_everything(kind, device):
    native(device)
    sizes = (17, 300, 65536 + 1)  # the last one spans chunks
    params = make_params(device, torch.bfloat16, sizes=sizes)
    opt = MAKERS[kind](params, master_weights=True)
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


@pytest.mark.parametrize("kind", KINDS)
def test_grad_scale_divides_grads_on_the_device(kind, device):
    native(device)
    sizes = (1000, 70000)
    a, b = make_params(device, sizes=sizes), make_params(device, sizes=sizes)
    oa, ob = MAKERS[kind](a), MAKERS[kind](b)
    for step_grads in make_grads(sizes=sizes, steps=2):
        for p, q, g in zip(a, b, step_grads):
            p.grad, q.grad = (g * 1024).to(device), g.to(device)
        oa.step(grad_scale=torch.tensor([1024.0], device=device))  # a power of two: exact
        ob.step()
        for p, q, g in zip(a, b, step_grads):
            assert torch.equal(p.grad.cpu(), g)  # written back unscaled
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())


def assert_devices_agree(kind, gpu_tensor, cpu_tensor, fp64=False):
    if kind in BIT_EXACT_ACROSS_DEVICES:
        assert torch.equal(gpu_tensor.detach().cpu(), cpu_tensor.detach())
    elif fp64:
        torch.testing.assert_close(gpu_tensor.detach().cpu(), cpu_tensor.detach(), rtol=1e-10, atol=1e-12)
    else:
        ulps_close(gpu_tensor, cpu_tensor, NORM_ULPS)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_fp64_cuda_kernel_matches_cpu_kernel(kind, both_native):
    on_gpu, on_cpu = make_params("cuda", torch.float64), make_params("cpu", torch.float64)
    og, oc = MAKERS[kind](on_gpu), MAKERS[kind](on_cpu)
    grads = make_grads(dtype=torch.float64)
    run(og, on_gpu, grads)
    run(oc, on_cpu, grads)
    for a, c in zip(on_gpu, on_cpu):
        assert_devices_agree(kind, a, c, fp64=True)


@pytest.mark.gpu
@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("kind", KINDS)
def test_grad_scale_cuda_kernel_matches_cpu_kernel(kind, maximize, both_native):
    on_gpu, on_cpu = make_params("cuda"), make_params("cpu")
    og, oc = MAKERS[kind](on_gpu, maximize=maximize), MAKERS[kind](on_cpu, maximize=maximize)
    grads = make_grads()
    run(og, on_gpu, grads, grad_scale=torch.tensor([3.0], device="cuda"))  # 3: a rounding in every division
    run(oc, on_cpu, grads, grad_scale=torch.tensor([3.0]))
    for a, c in zip(on_gpu, on_cpu):
        assert_devices_agree(kind, a, c)
        assert_devices_agree(kind, a.grad, c.grad)  # the unscaled grads written back
        for key, value in og.state[a].items():
            if key != "step":
                assert_devices_agree(kind, value, oc.state[c][key])
        assert og.state[a].get("step", torch.tensor(float(STEPS))).item() == STEPS
