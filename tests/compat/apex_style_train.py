"""A training script written for NVIDIA Apex, unmodified except that it picks the
device: run by tests/compat/test_apex_compat.py through `python -m core_ops.compat.apex`."""

import argparse

import amp_C
import torch
import torch.nn.functional as F
from apex import amp
from apex.multi_tensor_apply import multi_tensor_applier
from apex.normalization import FusedLayerNorm
from apex.optimizers import FusedAdam
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--opt-level", default="O1")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--keep-batchnorm-fp32", default=None)
parser.add_argument("--loss-scale", default=None)
parser.add_argument("--checkpoint", default=None)
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), FusedLayerNorm(64), nn.ReLU(), nn.Linear(64, 64),
                      nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4)).to(device)
optimizer = FusedAdam(model.parameters(), lr=3e-3)
model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level,
                                  keep_batchnorm_fp32=args.keep_batchnorm_fp32,
                                  loss_scale=args.loss_scale)

x = torch.randn(256, 16, device=device)
y = (x[:, :4].argmax(dim=1))
overflow_buf = torch.zeros(1, dtype=torch.int, device=device)
losses = []
for step in range(args.steps):
    batch = slice((step % 8) * 32, (step % 8) * 32 + 32)
    loss = F.cross_entropy(model(x[batch]), y[batch])
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    grads = [p.grad for p in amp.master_params(optimizer) if p.grad is not None]
    grad_norm = multi_tensor_applier(amp_C.multi_tensor_l2norm, overflow_buf, [grads], False)[0]
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 5.0)
    optimizer.step()
    losses.append(loss.item())

if args.checkpoint:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "amp": amp.state_dict()}, args.checkpoint)
print(f"first_loss={sum(losses[:4]) / 4:.4f} final_loss={sum(losses[-4:]) / 4:.4f} "
      f"grad_norm={grad_norm.item():.4f} weight_dtype={model[0].weight.dtype} "
      f"loss_scale={amp.state_dict()['loss_scaler0']['loss_scale']}")
