"""core_ops.amp on this machine, in the same run (interleaved):

1. Loss-scaler overhead against a bare FusedAdam step on the same params (20M fp32 in
   200 tensors): (a) ``LossScaler.step`` + ``update`` (overflow check by one read-only
   norm pass, unscale inside the kernel); (b) the full explicit path, ``scale`` +
   ``unscale_`` (in place, with the overflow check) + ``step`` + ``update``, which is
   what ``amp.scale_loss`` does at O1. Target: (b) within 1.10x of the bare step.
   (c) as (a) on fp16 params with fp32 master weights (FusedAdam(master_weights=True)),
   where the check reads 2 bytes per element against the step's 30.
2. A training step (forward, backward, step) of a small MLP at O2 bf16 with FusedAdam
   against the same model trained with ``torch.autocast(bfloat16)`` +
   ``AdamW(fused=True)``. Target: <= 1.0x.

    python bench/bench_amp.py [--device cpu|cuda] [--repeats 20] [--threads N]
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

import harness
from bench_optimizers import make  # fp32 params with grads, the optimizer benches' inputs
from core_ops import amp
from core_ops.amp import LossScaler
from core_ops.optimizers import FusedAdam


def scaler_overhead(args):
    bare = FusedAdam(make(args), lr=1e-4)
    fused = FusedAdam(make(args), lr=1e-4)
    explicit = FusedAdam(make(args), lr=1e-4)
    s_fused, s_explicit = LossScaler(args.device, init_scale=1.0), LossScaler(args.device, init_scale=1.0)
    loss = torch.ones((), device=args.device)

    def fused_path():
        s_fused.scale(loss)
        s_fused.step(fused)
        s_fused.update()

    def explicit_path():
        # init_scale=1 and growth_interval=2000 keep the grads' values steady over the
        # repeats; the work done does not depend on the value of the scale.
        s_explicit.scale(loss)
        s_explicit.unscale_(explicit)
        s_explicit.step(explicit)
        s_explicit.update()

    half = [p.detach().half().requires_grad_() for p in make(args)]
    for p, q in zip(half, make(args)):
        p.grad = q.grad.half()
    bare16 = FusedAdam(half, lr=1e-4, master_weights=True)
    fused16 = FusedAdam([p.detach().clone().requires_grad_() for p in half], lr=1e-4,
                        master_weights=True)
    for p, q in zip(fused16.param_groups[0]["params"], half):
        p.grad = q.grad.clone()
    s_16 = LossScaler(args.device, init_scale=1.0)

    def fp16_path():
        s_16.scale(loss)
        s_16.step(fused16)
        s_16.update()

    rows = []
    for name, base, fn in (
            ("LossScaler.step+update (check in kernel)", bare.step, fused_path),
            ("scale+unscale_+step+update (amp O1 path)", bare.step, explicit_path),
            ("fp16 + fp32 masters: LossScaler.step+update", bare16.step, fp16_path)):
        bt, ct = harness.time_ab(base, fn, args.device, args.repeats, args.warmup)
        rows.append(harness.row(name, "the same FusedAdam's step() alone", bt, ct,
                                1.10 if "unscale_" in name else None))
    # For context, torch's own overhead: GradScaler + AdamW(fused=True) against the bare step.
    torch_bare = torch.optim.AdamW(make(args), lr=1e-4, fused=True)
    torch_scaled = torch.optim.AdamW(make(args), lr=1e-4, fused=True)
    torch_scaler = torch.amp.GradScaler(args.device, init_scale=1.0)

    def torch_path():
        torch_scaler.scale(loss)
        torch_scaler.step(torch_scaled)
        torch_scaler.update()

    bt, ct = harness.time_ab(torch_bare.step, torch_path, args.device, args.repeats, args.warmup)
    rows.append(harness.row("torch: GradScaler.step+update, AdamW(fused=True)",
                            "AdamW(fused=True).step() alone", bt, ct))
    return rows


def mlp(width, depth):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def o2_vs_autocast(args, width=1024, depth=4, batch=256):
    x = torch.randn(batch, width, device=args.device)
    y = torch.randint(0, 10, (batch,), device=args.device)
    base_model = mlp(width, depth).to(args.device)
    ours_model = copy.deepcopy(base_model)
    base_opt = torch.optim.AdamW(base_model.parameters(), lr=1e-4, fused=True)
    ours_opt = FusedAdam(ours_model.parameters(), lr=1e-4)
    ours_model, ours_opt = amp.initialize(ours_model, ours_opt, opt_level="O2",
                                          half_dtype=torch.bfloat16, verbosity=0)

    def baseline():
        base_opt.zero_grad()
        with torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16):
            out = base_model(x)
        F.cross_entropy(out.float(), y).backward()
        base_opt.step()

    def ours():
        ours_opt.zero_grad()
        loss = F.cross_entropy(ours_model(x), y)
        with amp.scale_loss(loss, ours_opt) as scaled:
            scaled.backward()
        ours_opt.step()

    bt, ct = harness.time_ab(baseline, ours, args.device, args.repeats, args.warmup)
    n = sum(p.numel() for p in base_model.parameters())
    return [harness.row(f"O2 bf16 MLP step ({n / 1e6:.1f}M params, batch {batch})",
                        "autocast(bf16) + AdamW(fused=True)", bt, ct, 1.0)]


def main():
    args = harness.parser(__doc__.splitlines()[0], repeats=20).parse_args()
    harness.setup(args)
    rows = scaler_overhead(args) + o2_vs_autocast(args) + o2_vs_autocast(args, 256, 3, 64)
    harness.compare(rows)
    if args.json:
        harness.write_json(args.json, rows, **harness.machine())
    if args.plot:
        harness.plot(rows, args.plot, "core_ops.amp")


if __name__ == "__main__":
    main()
