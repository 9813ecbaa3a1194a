"""Tensor lists that probe the kernels' edges (shared by the multi-tensor tests)."""

import torch

# Chunk sizes of the native kernels: 16384 elements on CPU, 65536 on CUDA.
CHUNKS = (16384, 65536)
EDGE_SIZES = sorted({0, 1, 7, 33} | {c + d for c in CHUNKS for d in (-1, 0, 1)})


def make_list(sizes, dtype, device, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=g) * scale).to(dtype=dtype, device=device) for n in sizes]


def noncontiguous(n, dtype, device, seed=0):
    """A transposed view (n x 3 -> 3 x n) with the same element count pattern."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g).to(dtype=dtype, device=device).t()


def poison(t, where, value):
    """Puts ``value`` at the first, middle or last element of ``t`` (in place)."""
    flat = t.view(-1)
    idx = {"first": 0, "middle": flat.numel() // 2, "last": flat.numel() - 1}[where]
    flat[idx] = value
    return t
