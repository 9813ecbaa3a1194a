"""Every op passes torch.library.opcheck (schema, fake kernel, dispatch) on every
device, and the ops trace under torch.compile."""

import pytest
import torch

import core_ops
from core_ops import native


def samples(device):
    ts = [torch.randn(n, device=device) for n in (3, 17, 16385)]
    half = [t.half() for t in ts]
    flag = torch.zeros(1, device=device)
    one = torch.ones(1, device=device)
    return {
        "multi_tensor_scale_": (half, [torch.empty_like(t) for t in ts], one * 0.5, flag.clone()),
        "multi_tensor_axpby_": (ts, half, [torch.empty_like(t) for t in ts], 2.0, -1.0, flag.clone(), -1),
        "multi_tensor_l2norm": ([t.clone() for t in ts], True),
        "multi_tensor_check_finite_": (half, flag.clone()),
        "multi_tensor_unscale_l2norm_": ([t.clone() for t in half], one * 0.25, flag.clone(), False),
        "layer_norm_fwd": (torch.randn(3, 5, 40, device=device).half(), torch.rand(40, device=device),
                           torch.randn(40, device=device), 40, 1e-5, torch.float32, False),
        "layer_norm_bwd": (torch.randn(7, 33, device=device), torch.randn(7, 33, device=device),
                           torch.randn(7, device=device), torch.rand(7, device=device) + 1,
                           torch.rand(33, device=device) + 0.5, None, 33, False, torch.float32),
        "rms_norm_fwd": (torch.randn(6, 17, device=device, dtype=torch.bfloat16), None, 17, 1e-6, None, True),
        "rms_norm_bwd": (torch.randn(6, 17, device=device), torch.randn(6, 17, device=device),
                         torch.rand(6, device=device) + 1, torch.rand(17, device=device) + 0.5, 17, True,
                         torch.float32),
        "fused_add_rms_norm_fwd": (torch.randn(5, 24, device=device), torch.randn(5, 24, device=device),
                                   torch.rand(24, device=device), 24, 1e-6, False),
        "update_scale_": (one * 1024, torch.zeros(1, dtype=torch.int32, device=device),
                          torch.ones(1, dtype=torch.int32, device=device), flag.clone(),
                          2.0, 0.5, 2000, 1, 0.0, 2.0 ** 24),
    }


@pytest.mark.parametrize("name", list(samples("cpu")))
def test_opcheck(device, name):
    native.ensure(device)
    torch.library.opcheck(getattr(torch.ops.core_ops, name).default, samples(device)[name])


@pytest.mark.inductor_cpu  # its cpu case
def test_torch_compile_clip_step(device):
    """A compiled unscale + global-norm clip gives the eager result."""
    native.ensure(device)

    def clip(grads, inv_scale, max_norm):
        total, _, found = core_ops.multi_tensor_unscale_l2norm(grads, inv_scale)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        core_ops.multi_tensor_scale(grads, grads, coef)
        return total, found

    grads = [torch.randn(n, device=device) * 64 for n in (10, 300, 16385)]
    eager = [g.clone() for g in grads]
    inv = torch.tensor([1 / 64], device=device)
    total_e, found_e = clip(eager, inv, 1.0)
    total_c, found_c = torch.compile(clip, fullgraph=True)(grads, inv, 1.0)
    torch.testing.assert_close(total_c, total_e)
    assert found_c.item() == found_e.item() == 0
    for a, b in zip(grads, eager):
        torch.testing.assert_close(a, b)
