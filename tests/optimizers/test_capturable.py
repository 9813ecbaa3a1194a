"""capturable=True, Apex's flag for CUDA graphs (FusedAdam's alone: the registry's generic
test "capturable", optimizer_registry.py), on each device: each group's
lr is held as a tensor on its params' device and read by the kernel there, so one
captured (or compiled) step follows an LR schedule that torch's schedulers fill in
place; the step count is already a device tensor. Tested here through
torch.compile(fullgraph=True): the compiled step follows the schedule with one graph
and no recompile, equal bit for bit to eager capturable steps (aot_eager runs the
same kernels) and within float32 roundings of steps with a float lr (a tensor lr
is read in float32; a float lr's step size is worked out in double).
The CUDA-graph capture itself: tests/optimizers/test_cuda_graphs.py and
tests/amp/test_cuda_graphs_amp.py (GPU only)."""

import io

import pytest
import torch
from optim_cases import DEVICES
from optimizer_registry import cases

CAPTURABLE = cases("capturable")


def params(device, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(device, dtype).requires_grad_() for n in (300, 40)]


def set_grads(ps, k):
    g = torch.Generator().manual_seed(100 + k)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(p.device, p.dtype)


@pytest.mark.parametrize("info", CAPTURABLE)
@pytest.mark.parametrize("device", DEVICES)
def test_capturable_holds_each_groups_lr_as_a_tensor_on_its_params_device(device, info):
    a, b = params(device), params(device, 1, torch.float64)
    opt = info.make([{"params": a}, {"params": b, "lr": 0.5}], lr=1e-3, capturable=True)
    lrs = [g["lr"] for g in opt.param_groups]
    assert [(lr.dtype, lr.shape, lr.device.type, float(lr)) for lr in lrs] == [
        (torch.float32, (), device, float(torch.tensor(1e-3))), (torch.float64, (), device, 0.5)]
    opt.add_param_group({"params": params(device, 2)})
    assert isinstance(opt.param_groups[-1]["lr"], torch.Tensor)
    assert isinstance(info.make(params(device), lr=1e-3).param_groups[0]["lr"], float)  # not capturable: as given


# The schedulers wrap opt.step after it was compiled: they cannot see it called.
@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
@pytest.mark.parametrize("info", CAPTURABLE)
@pytest.mark.parametrize("device", DEVICES)
def test_a_compiled_capturable_step_follows_an_lr_schedule_with_one_graph(device, info):
    from torch._dynamo.utils import counters
    schedule = lambda k: 1.0 / (1 + k)  # noqa: E731
    eager_ps, compiled_ps = params(device), params(device)
    eager = info.make(eager_ps, lr=1e-2, weight_decay=0.1, capturable=True)  # uncompiled
    captured = info.make(compiled_ps, lr=1e-2, weight_decay=0.1, capturable=True)
    lr_tensor = captured.param_groups[0]["lr"]
    for opt, ps in ((eager, eager_ps), (captured, compiled_ps)):
        set_grads(ps, 0)
        opt.step()  # the state, made outside the graph
    counters.clear()
    # Compiled before the schedulers wrap opt.step: dynamo does not trace their
    # wrapper (in torch/optim/lr_scheduler.py), so fullgraph=True refuses it.
    step = torch.compile(captured.step.__func__, backend="aot_eager", fullgraph=True)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in (eager, captured)]
    for k in range(1, 6):
        set_grads(eager_ps, k), set_grads(compiled_ps, k)
        eager.step()
        step(captured)
        for s in schedulers:
            s.step()
    assert captured.param_groups[0]["lr"] is lr_tensor  # filled in place by the scheduler
    assert float(lr_tensor) == float(torch.tensor(1e-2 * schedule(5)))
    assert counters["stats"]["unique_graphs"] == 1  # five lrs, one graph
    for p, q in zip(eager_ps, compiled_ps):
        assert torch.equal(p, q)
    float_ps = params(device)  # the same schedule with a float lr
    plain = info.make(float_ps, lr=1e-2, weight_decay=0.1)
    for k in range(6):
        set_grads(float_ps, k)
        plain.step()
        if k == 0:
            scheduler = torch.optim.lr_scheduler.LambdaLR(plain, schedule)
        else:
            scheduler.step()
    for p, q in zip(float_ps, compiled_ps):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("info", CAPTURABLE)
@pytest.mark.parametrize("device", DEVICES)
def test_a_capturable_state_dict_loads_with_weights_only_and_keeps_the_lr_on_the_device(device, info):
    ps = params(device)
    opt = info.make(ps, lr=1e-3, capturable=True)
    set_grads(ps, 0)
    opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    plain = info.make(params(device), lr=1e-1)
    plain_sd = plain.state_dict()  # a float lr, loaded into a capturable one
    again = info.make(params(device), lr=1e-1, capturable=True)
    again.load_state_dict(saved)
    lr = again.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.device.type == device and float(lr) == float(torch.tensor(1e-3))
    other = info.make(params(device), lr=1e-3, capturable=True)
    other.load_state_dict(plain_sd)
    assert isinstance(other.param_groups[0]["lr"], torch.Tensor) and float(other.param_groups[0]["lr"]) == float(
        torch.tensor(1e-1))
    for key, value in opt.state[ps[0]].items():
        assert torch.equal(value, again.state[again.param_groups[0]["params"][0]][key]), key
