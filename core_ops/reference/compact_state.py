"""Compact optimizer state, in pure PyTorch: the specification the native kernels
follow (csrc/include/core_ops/compact_state.h) and the tests' oracle.

Note [Master remainders]: an fp32 master of a bfloat16 param is kept as the param
(the master rounded to nearest even, what ``master.to(torch.bfloat16)`` gives) and an
int16 remainder r, the master's bits less the param's bits shifted up 16: the master
is ``(param_bits << 16) + r``, exactly, for +-0, subnormals, values that round to
+-inf in bfloat16 and NaN (which stays a NaN). One case cannot be kept in 16 bits:
2**16 + 1 masters round to each even bfloat16 value, the two exact ties at r = +-0x8000
included (the ambiguity behind NVIDIA/apex#1842, where one of them comes back 2**16
float32 ulps off). Here a master that lands exactly on a tie (its low 16 bits are
0x8000: about one element in 65536 an update) is moved one float32 ulp towards its
param first, which rounds to the same param: params stay those of fp32 masters, and
such a master differs from the fp32 one by one ulp (2**-24 relative), not 2**-8.

Note [Blockwise 8-bit moments]: Adam's moments quantized as in "8-bit Optimizers via
Block-wise Quantization" (Dettmers et al., ICLR 2022): a tensor's elements, in memory
order, fall into blocks of BLOCK; each block keeps its absolute maximum in float32 and
each element the index (uint8) of the value of a 256-entry map nearest to it divided
by that maximum. The maps are dynamic: a sign (first moment only), then a power of
ten from 1e-6 to 1e-1 and a fraction on a linear grid whose step is finer near 1, so
both tiny and large values in a block keep a few digits. "Nearest" is exact and
reproducible on every device: the code is the number of midpoints between
neighbouring map values that are below the normalized value (ties go down), the
normalized value being ``x * (1 / absmax)`` in float32 (0 for an all-zero block).
"""

import torch

BLOCK = 256
# Tensors with fewer elements keep float32 moments under state_dtype="int8" (the
# default of FusedAdam's min_8bit_size, as bitsandbytes'): their block maxima and the
# extra kernel work would cost more than the bytes saved.
MIN_QUANTIZED_NUMEL = 4096
_DECADES = 7  # 1e-6 ... 1e0


def dynamic_map(signed):
    """The 256 sorted float32 values of the dynamic map: in [-1, 1] (signed, for the
    first moment) or [0, 1] (unsigned, for the second). 0 and 1 are in both; each
    decade 10**(k-6), k = 0..6, holds the midpoints of a linear grid over [0.1, 1]
    with 2**k cells (2**(k+1) unsigned, which needs no sign bit)."""
    values = [0.0, 1.0]
    for k in range(_DECADES):
        cells = 2 ** k if signed else 2 ** (k + 1)
        edges = torch.linspace(0.1, 1.0, cells + 1, dtype=torch.float64)
        mids = (edges[:-1] + edges[1:]) / 2 * 10.0 ** (k - _DECADES + 1)
        values += mids.tolist() + ((-mids).tolist() if signed else [])
    table = torch.tensor(sorted(values), dtype=torch.float64).to(torch.float32)
    assert table.numel() == 256 and bool((table[1:] > table[:-1]).all())
    return table


def midpoints(qmap):
    """The 255 decision points between neighbouring map values, in float32 as the
    kernels compute them: (a + b) * 0.5."""
    return (qmap[:-1] + qmap[1:]) * 0.5


def blocks_of(numel):
    return (numel + BLOCK - 1) // BLOCK


def flat(t):
    """``t``'s elements in memory order, as a view (``t`` is dense: contiguous or a
    permutation of it, as the optimizers lay state out like their params)."""
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def quantize(x, qmap):
    """(codes, absmax): ``x`` (a 1-d float32 tensor) in blocks of BLOCK, each block's
    absolute maximum and each element's code (Note [Blockwise 8-bit moments])."""
    n = x.numel()
    padded = torch.nn.functional.pad(x, (0, blocks_of(n) * BLOCK - n)).view(-1, BLOCK)
    absmax = padded.abs().amax(dim=1)
    inv = torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))
    normalized = (padded * inv[:, None]).reshape(-1)[:n]
    codes = torch.searchsorted(midpoints(qmap.to(x.device)), normalized, side="left")
    return codes.to(torch.uint8), absmax


def dequantize(codes, absmax, qmap):
    """The float32 values of ``codes`` (1-d uint8) with their blocks' ``absmax``."""
    n = codes.numel()
    scale = absmax.repeat_interleave(BLOCK)[:n]
    return qmap.to(codes.device)[codes.long()] * scale


def split_master(master):
    """(bfloat16 param, int16 remainder) of a float32 master (Note [Master remainders])."""
    param = master.to(torch.bfloat16)
    high = param.view(torch.int16).to(torch.int64) & 0xFFFF
    r = (master.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) - (high << 16)
    r = r.clamp(-0x7FFF, 0x7FFF)  # a tie at +-0x8000 moves one ulp towards the param
    r = torch.where(torch.isnan(master), torch.zeros_like(r), r)
    return param, r.to(torch.int16)


def join_master(param, remainder):
    """The float32 master of a bfloat16 ``param`` and its int16 ``remainder``."""
    bits = ((param.view(torch.int16).to(torch.int64) & 0xFFFF) << 16) + remainder.to(torch.int64)
    bits = bits & 0xFFFFFFFF
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits)  # two's complement int32
    return bits.to(torch.int32).view(torch.float32)
