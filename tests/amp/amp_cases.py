"""A small conv net with BatchNorm, its data, and a training loop written the Apex
way (``amp.initialize`` / ``amp.scale_loss``), shared by the amp tests."""

import torch
import torch.nn.functional as F
from torch import nn

from core_ops import amp

LEVELS = ["O0", "O1", "O2", "O3"]
HALVES = [torch.float16, torch.bfloat16]


def conv_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4),
    )


def batches(n, batch=32, seed=1):
    """A learnable task: the class is which quadrant of the image is brightest."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(batch, 3, 8, 8, generator=g)
        y = torch.randint(0, 4, (batch,), generator=g)
        for i, c in enumerate(y.tolist()):
            r, s = divmod(c, 2)
            x[i, :, 4 * r:4 * r + 4, 4 * s:4 * s + 4] += 1.5
        out.append((x, y))
    return out


def train(model, optimizer, data, loss_id=0):
    """Apex's loop; returns the losses as floats."""
    losses = []
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer, loss_id=loss_id) as scaled:
            scaled.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def optimizer_state(optimizer):
    """A deep copy of every state tensor, keyed by (param index, name)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return {(i, k): v.clone() for i, p in enumerate(params)
            for k, v in optimizer.state.get(p, {}).items() if isinstance(v, torch.Tensor)}


def inject(model, value, index=0):
    """Puts ``value`` (inf or nan) into one grad element of the model's first param."""
    p = next(model.parameters())
    p.grad.view(-1)[index] = value
