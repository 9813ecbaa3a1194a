"""SyncBatchNorm's CUDA kernels (run by tests/gpu/run.sh on a GPU machine; skipped here):
against the reference on CUDA and against torch.nn.SyncBatchNorm at world size 1. Their
speed against torch's is bench/bench_syncbn.py --device cuda."""

import datetime

import pytest
import torch
import torch.distributed as dist

from _launch import free_port
from core_ops import native
from core_ops.parallel import SyncBatchNorm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_torch_sync_batchnorm_world_size_1(dtype, fmt):
    assert native.ensure("cuda").native
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        x = torch.randn(16, 32, 20, 20, device="cuda").to(dtype).contiguous(memory_format=fmt)
        dy = torch.randn_like(x)
        ref = torch.nn.SyncBatchNorm(32).cuda()
        ours = SyncBatchNorm(32).cuda()
        outs = []
        for m in (ref, ours):
            xi = x.detach().clone().requires_grad_()
            y = m(xi)
            y.backward(dy)
            outs.append((y.float(), xi.grad.float(), m.weight.grad, m.bias.grad, m.running_var))
        tol = dict(rtol=2e-3, atol=2e-3) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
        for a, b in zip(*outs):
            torch.testing.assert_close(b, a, **tol)
    finally:
        dist.destroy_process_group()

