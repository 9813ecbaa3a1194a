"""Reproducer of a torch dynamo bug (torch 2.14.1), not yet reduced to torch alone:

    python tools/upstream/dynamo_stale_frame_after_backward.py

A train step (forward, ``backward()``, optimizer step) compiled with
``fullgraph=True`` and ``torch._dynamo.config.trace_autograd_ops = True`` trains
correctly; here it holds core_ops' amp at O2 (a ``scale_loss`` context manager around
the backward, fp32 master grads written in it). Once its model is gone, compiling an
unrelated optimizer step in the same process fails while dynamo writes the graph's
side effects: it reconstructs ``model[2].bias.grad`` through the first frame's
closure cell, which the new frame does not have:

    AssertionError: 'model' not in cell_and_freevars

``torch._dynamo.reset()`` and ``gc.collect()`` between the two do not help; at O1 and
O3 (no master grads) it does not happen. Exit status 1 when the bug shows.
"""

import gc
import sys

import torch
from torch import nn

from core_ops import amp
from core_ops.optimizers import FusedAdam


def compiled_o2_training():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)

    def train_step(x):
        loss = model(x).float().sum()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        return loss.detach()

    step = torch.compile(train_step, backend="aot_eager", fullgraph=True)
    for _ in range(2):
        step(torch.randn(2, 16))
        opt.zero_grad()


def main():
    torch._dynamo.config.trace_autograd_ops = True
    compiled_o2_training()
    torch._dynamo.reset()
    gc.collect()
    params = [torch.randn(10, requires_grad=True)]
    params[0].grad = torch.randn(10)
    other = FusedAdam(params, lr=1e-3)
    other.step()
    try:
        torch.compile(other.step, backend="aot_eager", fullgraph=True)()
    except AssertionError as e:
        print(f"bug: {e}")
        return 1
    print("no bug: the second compile worked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
