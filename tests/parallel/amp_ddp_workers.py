"""What each rank runs for test_amp_ddp.py: Apex's classic recipe, amp.initialize at
O2 then core_ops' DistributedDataParallel, with an overflow on one rank only."""

import math

import torch
import torch.nn.functional as F

from core_ops import amp
from core_ops.optimizers import FusedAdam
from core_ops.parallel import DistributedDataParallel
from ddp_workers import data, local, mlp

OVERFLOW_STEP = 2


def o2_with_ddp(rank, world):
    model = mlp(0, width=16)
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    model = DistributedDataParallel(model)
    first = model.module[0].weight
    step = {"i": 0}
    if rank == 1:  # rank 1 alone overflows at OVERFLOW_STEP; the allreduce spreads it
        first.register_hook(lambda g: torch.full_like(g, math.inf)
                            if step["i"] == OVERFLOW_STEP else g)
    history = []
    for i in range(5):
        step["i"] = i
        x, y = data(i)
        opt.zero_grad()
        loss = F.mse_loss(model(local(x, rank, world)), local(y, rank, world))
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        history.append(dict(scale=amp.state_dict()["loss_scaler0"]["loss_scale"],
                            params=[p.detach().clone() for p in model.module.parameters()],
                            masters=[m.detach().clone() for m in amp.master_params(opt)]))
    return history
