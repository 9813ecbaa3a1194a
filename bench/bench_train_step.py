"""A whole mixed-precision training step of a pre-norm transformer stack, torch's idiom
against core-ops', in the same run (interleaved), time and peak memory:

  torch     torch.autocast(half) + GradScaler (fp16 only; bf16 needs none) +
            AdamW(fused=True), the stack with torch's nn.LayerNorm / nn.RMSNorm
  core-ops  amp.initialize(opt_level="O2", half_dtype=half) + FusedAdam + amp.scale_loss,
            the same stack with torch's norms, and with core_ops' FusedLayerNorm /
            FusedRMSNorm in their place

Each row is one half dtype and one kind of norm; the ratio is core-ops' median step
time over torch's. Target on a GPU: <= 0.75 (issue 26). On a CPU, fp16 is left out by
default: its matmuls run far slower than float32 there (see the README), which says
nothing about either idiom.

    python bench/bench_train_step.py [--device cuda] [--dtypes fp16,bf16] [--layers 12]
        [--width 1024] [--heads 16] [--batch 16] [--seq 512] [--repeats 20]

Defaults: the stack of the first H200 run on a GPU (12 layers, d 1024, 16 heads, ffn
4096, batch 16 x 512); on a CPU, 4 layers of d 256 on 4 x 128 tokens.
"""

import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import harness
from core_ops import amp
from core_ops.normalization import FusedLayerNorm, FusedRMSNorm
from core_ops.optimizers import FusedAdam

# The demo's pre-norm block (self-attention and MLP, each with a residual): the stack
# measured here is the one the demo trains.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "lightning" / "examples"))
from char_lm import Block  # noqa: E402

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
NORMS = {"LayerNorm": (nn.LayerNorm, FusedLayerNorm), "RMSNorm": (nn.RMSNorm, FusedRMSNorm)}


def stack(args, norm):
    torch.manual_seed(0)
    return nn.Sequential(*[Block(args.width, args.heads, norm) for _ in range(args.layers)]).to(args.device)


def with_norm(model, norm):
    """A copy of ``model`` with every norm replaced by ``norm`` holding the same weights."""
    model = copy.deepcopy(model)
    for block in model:
        for name in ("norm1", "norm2"):
            old = getattr(block, name)
            new = norm(old.normalized_shape, eps=old.eps).to(old.weight.device)
            new.load_state_dict(old.state_dict())
            setattr(block, name, new)
    return model


def peak_gib(device, fn):
    """Peak memory allocated during one call of ``fn``, in GiB (CUDA only)."""
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def torch_step(args, model, half):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler(args.device, enabled=half == torch.float16)
    kind = torch.device(args.device).type

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, dtype=half):
            out = model(x)
        scaler.scale(F.mse_loss(out.float(), y)).backward()
        scaler.step(opt)
        scaler.update()

    return step


def core_ops_step(model, half):
    model, opt = amp.initialize(model, FusedAdam(model.parameters(), lr=1e-4), opt_level="O2",
                                half_dtype=half, verbosity=0)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        out = model(x.to(half))
        with amp.scale_loss(F.mse_loss(out.float(), y), opt) as scaled:
            scaled.backward()
        opt.step()

    return step


def rows_for(args, half_name, norm_name):
    half = HALF[half_name]
    torch_norm, fused_norm = NORMS[norm_name]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.seq, args.width, generator=g).to(args.device)
    y = torch.randn(args.batch, args.seq, args.width, generator=g).to(args.device)
    base_model = stack(args, torch_norm)
    base = torch_step(args, base_model, half)
    rows = []
    for label, model in (("torch's norms", copy.deepcopy(base_model)),
                         ("core_ops' fused norms", with_norm(base_model, fused_norm))):
        ours = core_ops_step(model, half)
        bt, ct = harness.time_ab(lambda: base(x, y), lambda: ours(x, y), args.device, args.repeats, args.warmup)
        row = harness.row(f"{half_name} {norm_name} stack, O2 + FusedAdam, {label}",
                          f"autocast({half_name}) + {'GradScaler + ' if half_name == 'fp16' else ''}AdamW(fused=True)",
                          bt, ct, 0.75 if torch.device(args.device).type == "cuda" else None)
        row.update(baseline_peak_gib=peak_gib(args.device, lambda: base(x, y)),
                   core_ops_peak_gib=peak_gib(args.device, lambda: ours(x, y)))
        rows.append(row)
    return rows


def main():
    p = harness.parser(__doc__.splitlines()[0], repeats=20)
    p.add_argument("--dtypes", help="comma-separated of fp16, bf16 (default: both on a GPU, bf16 on a CPU)")
    p.add_argument("--norms", default="LayerNorm,RMSNorm")
    for name in ("layers", "width", "heads", "batch", "seq"):
        p.add_argument(f"--{name}", type=int)
    args = p.parse_args()
    harness.setup(args)
    gpu = args.device == "cuda"
    defaults = dict(layers=12, width=1024, heads=16, batch=16, seq=512) if gpu else \
        dict(layers=4, width=256, heads=4, batch=4, seq=128)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    dtypes = (args.dtypes or ("fp16,bf16" if gpu else "bf16")).split(",")
    rows = [r for d in dtypes for n in args.norms.split(",") for r in rows_for(args, d, n)]
    harness.report(rows, args)
    if gpu:
        print("\n| case | torch peak GiB | core-ops peak GiB |\n|---|---:|---:|")
        for r in rows:
            print(f"| {r['case']} | {r['baseline_peak_gib']:.2f} | {r['core_ops_peak_gib']:.2f} |")
    if args.plot:
        harness.plot(rows, args.plot, "training step: core-ops O2 against torch's AMP")


if __name__ == "__main__":
    main()
