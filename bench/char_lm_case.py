"""The demo's transformer (plugins/lightning/examples/char_lm.py) as a bench case: its
size arguments, the model at those sizes, and batches of its corpus that are the same
in every run."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "lightning" / "examples"))
import char_lm  # noqa: E402


def add_size_args(p):
    """--batch, --seq, --width and --layers, the demo's sizes by default."""
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)


def model(args, fused=True):
    """The demo's model at the sizes in ``args``; ``fused`` picks FusedRMSNorm over nn.RMSNorm."""
    return char_lm.CharLM(fused=fused, width=args.width, layers=args.layers, seq=args.seq)


def batches(count, batch=16, seq=128, device="cpu"):
    """``count`` [inputs, targets] pairs of ``batch`` windows of ``seq`` bytes."""
    windows = char_lm.Windows(char_lm.corpus(), seq, count * batch)
    return [[torch.stack([windows[i][k] for i in range(s * batch, (s + 1) * batch)]).to(device) for k in (0, 1)]
            for s in range(count)]
