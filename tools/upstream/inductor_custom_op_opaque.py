"""Reproducer of a torch inductor limitation (torch 2.9 to 2.15), needing torch alone:

    python tools/upstream/inductor_custom_op_opaque.py

A custom op (``torch.library.custom_op``) is opaque to inductor: its generated code
calls the op's kernel as an extern call, unfused with the ops around it, even where
the op has a pure-PyTorch equivalent inductor could generate. torch has no public way
to give a custom op a decomposition for inductor alone (a CompositeImplicitAutograd
kernel decomposes it everywhere, eager runs included, so the native kernel would never
run). core_ops' workaround, for its norm ops: core_ops/torch_patches/inductor_norms.py.
Exit status 1 when the op stays an extern call.
"""

import sys

import torch
from torch._inductor.utils import run_and_get_code


@torch.library.custom_op("upstream_repro::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


@rms_norm.register_fake
def _(x, eps):
    return torch.empty_like(x)


def main():
    def block(x):
        return torch.nn.functional.gelu(rms_norm(x * 2.0, 1e-6))

    _, code = run_and_get_code(torch.compile(block), torch.randn(8, 64))
    opaque = any("upstream_repro" in c for c in code)
    print(f"torch {torch.__version__}: the custom op in inductor's code is "
          f"{'an extern call, unfused' if opaque else 'generated code'}")
    return 1 if opaque else 0


if __name__ == "__main__":
    sys.exit(main())
