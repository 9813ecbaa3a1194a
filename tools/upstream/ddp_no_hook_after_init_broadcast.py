"""Reproducer of a torch DistributedDataParallel limitation (torch 2.9 to 2.15), needing
torch alone:

    python tools/upstream/ddp_no_hook_after_init_broadcast.py

DDP's constructor broadcasts rank 0's params (and buffers) to every rank, and offers no
hook after it: a copy of the weights kept beside the module (mixed precision's fp32
masters, an EMA) is left as each rank made it, so the ranks step from different
weights. Here two gloo ranks build one Linear from different seeds, keep a float32
copy, and wrap the module: the params agree afterwards, the copies do not.
``init_sync=False`` skips the broadcast altogether. core_ops' workaround:
core_ops/torch_patches/ddp_init_broadcast.py. Exit status 1 when the limitation shows.
"""

import datetime
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def rank_main(rank, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    try:
        torch.manual_seed(rank)  # each rank its own initial weights
        module = nn.Linear(4, 4)
        copy = [p.detach().clone() for p in module.parameters()]  # as masters are made
        ddp = nn.parallel.DistributedDataParallel(module)
        params = torch.cat([p.detach().flatten() for p in ddp.parameters()])
        copies = torch.cat([c.flatten() for c in copy])
        gathered = [torch.empty_like(params) for _ in range(2)], [torch.empty_like(copies) for _ in range(2)]
        dist.all_gather(gathered[0], params)
        dist.all_gather(gathered[1], copies)
        if rank == 0:
            out.put((torch.equal(*gathered[0]), torch.equal(*gathered[1])))
    finally:
        dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(port, out), nprocs=2, join=True)
    params_agree, copies_agree = out.get()
    print(f"torch {torch.__version__}: after DistributedDataParallel(module) the ranks' params "
          f"{'agree' if params_agree else 'differ'}, the copies kept beside them "
          f"{'agree' if copies_agree else 'differ'}")
    return 1 if params_agree and not copies_agree else 0


if __name__ == "__main__":
    sys.exit(main())
