"""A small task the plugin test suites share (Lightning's and Accelerate's, in-process
and in their launched runs): a conv net with BatchNorm that learns which quadrant of an
8x8 image is brightest, and a counter of the allreduces core_ops' DDP sends."""

import torch
import torch.distributed as dist
from torch import nn

N, BATCH = 128, 16


def dataset(n=N, seed=1):
    """The brightest quadrant of an 8x8 image is its class (4 classes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    for i, c in enumerate(y.tolist()):
        r, s = divmod(c, 2)
        x[i, :, 4 * r:4 * r + 4, 4 * s:4 * s + 4] += 1.5
    return torch.utils.data.TensorDataset(x, y)


def loader(batch=BATCH, n=N):
    return torch.utils.data.DataLoader(dataset(n), batch_size=batch, shuffle=False)


def conv_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4))


def flat(tensors):
    return torch.cat([t.detach().float().flatten().cpu() for t in tensors])


class AllReduceCounter:
    """Counts torch.distributed.all_reduce calls (core_ops' DDP sends its buckets so)."""

    def __init__(self):
        self.count = 0
        self._original = None

    def __enter__(self):
        self._original = dist.all_reduce

        def counted(*args, **kwargs):
            self.count += 1
            return self._original(*args, **kwargs)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._original


class Block(torch.nn.Sequential):
    """A transformer-sized block in miniature, the unit the FSDP2 runs shard by."""

    def __init__(self):
        super().__init__(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16))
