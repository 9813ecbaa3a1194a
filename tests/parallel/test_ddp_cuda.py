"""core_ops' DistributedDataParallel over NCCL at world size 1 (run by tests/gpu/run.sh on
a GPU machine; skipped here): with amp O2 and SyncBatchNorm, a wrapped model steps
exactly as the same model unwrapped (an allreduce of one rank, divided by one, is the
identity), and the buckets' allreduce runs on the GPU."""

import copy
import datetime

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from _launch import free_port
from core_ops import amp
from core_ops.optimizers import FusedAdam
from core_ops.parallel import DistributedDataParallel, convert_syncbn_model

pytestmark = pytest.mark.gpu


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10)).cuda()


def train(model, opt, steps=4):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 3, 8, 8, generator=g).cuda(), torch.randint(0, 10, (8,), generator=g).cuda()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()


def test_o2_ddp_and_syncbn_over_nccl_step_as_the_unwrapped_model():
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        plain = convert_syncbn_model(net())  # SyncBatchNorm in both: only DDP differs
        wrapped = copy.deepcopy(plain)
        results = []
        for model, ddp in ((plain, False), (wrapped, True)):
            model, opt = amp.initialize(model, FusedAdam(model.parameters(), lr=1e-3), opt_level="O2",
                                        verbosity=0)
            if ddp:
                model = DistributedDataParallel(model)
            train(model, opt)
            module = model.module if ddp else model
            results.append(torch.cat([p.detach().float().flatten() for p in module.parameters()]))
            assert next(module.parameters()).dtype == torch.float16
        assert torch.equal(results[0], results[1])
    finally:
        dist.destroy_process_group()
