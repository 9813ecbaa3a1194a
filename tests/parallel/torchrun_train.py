"""A small data-parallel training run for test_torchrun.py, launched by torchrun on each
"node": a model with a SyncBatchNorm under DistributedDataParallel, 5 SGD steps on this
rank's data; saves the final params to <out>/rank<RANK>.pt."""

import datetime
import sys

import torch
import torch.distributed as dist
from torch import nn

from core_ops.parallel import DistributedDataParallel, convert_syncbn_model


def main(out):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))  # env:// from torchrun
    rank = dist.get_rank()
    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    model = convert_syncbn_model(nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                               nn.Linear(8, 2)))
    initial = [p.detach().clone() for p in model.parameters()]
    ddp = DistributedDataParallel(model, message_size=50)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x, y = torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    torch.save(dict(world=dist.get_world_size(), initial=initial,
                    params=[p.detach() for p in model.parameters()],
                    buffers=[b.detach() for b in model.buffers()]), f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
