"""An Apex-era script whose children import apex: torch.multiprocessing.spawn workers
and a DataLoader worker under the spawn start method. Each child re-imports this
file, so the imports at the top must work there too (Note [Children of the runner])."""

import sys

import torch
import torch.multiprocessing as mp

import amp_C  # noqa: F401
import apex
from apex import amp
from apex.parallel.LARC import LARC


def worker(rank, out):
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{amp.__name__} {LARC.__module__} {apex.optimizers.__name__} "
                f"{amp_C.multi_tensor_scale.__module__}")


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(float(i * i)) * amp_C.__name__.startswith("core_ops")


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=2)
    loader = torch.utils.data.DataLoader(Squares(), batch_size=2, num_workers=1,
                                         multiprocessing_context="spawn")
    print("loader", [b.tolist() for b in loader])
