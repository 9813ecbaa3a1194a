"""A data-parallel training script written for NVIDIA Apex (as its ImageNet example:
``--local_rank`` from the launcher, WORLD_SIZE from the environment, amp at O2,
apex.parallel's DDP and SyncBatchNorm, FusedAdam), unmodified except that it picks the
device and backend. Launched by test_apex_launchers.py through torchrun, accelerate
launch and deepspeed; each rank saves what it saw to <--out>/rank<RANK>.pt."""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from apex import amp
from apex.optimizers import FusedAdam
from apex.parallel import DistributedDataParallel as DDP
from apex.parallel import convert_syncbn_model
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

cuda = torch.cuda.is_available()
distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    if cuda:
        torch.cuda.set_device(args.local_rank)
    torch.distributed.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
rank = torch.distributed.get_rank() if distributed else 0
device = f"cuda:{args.local_rank}" if cuda else "cpu"

torch.manual_seed(rank)  # seeded apart: DDP must broadcast rank 0's weights and masters
model = convert_syncbn_model(nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                           nn.Linear(32, 4))).to(device)
optimizer = FusedAdam(model.parameters(), lr=1e-2)
model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
if distributed:
    model = DDP(model)

g = torch.Generator().manual_seed(100 + rank)
x = torch.randn(16, 8, generator=g).to(device)
y = x[:, :4].argmax(dim=1)
losses = []
for _ in range(args.steps):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    losses.append(loss.item())

torch.save(dict(rank=rank, local_rank=args.local_rank, world=torch.distributed.get_world_size() if distributed else 1,
                ddp=f"{type(model).__module__}.{type(model).__name__}", amp=amp.__name__, losses=losses,
                masters=[p.detach().cpu() for p in amp.master_params(optimizer)],
                argv=sys.argv[1:]), os.path.join(args.out, f"rank{rank}.pt"))
