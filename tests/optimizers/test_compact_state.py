"""The compact state formats of core_ops/reference/compact_state.py (the specification
the kernels follow): master remainders (Note [Master remainders]) and blockwise 8-bit
moments (Note [Blockwise 8-bit moments])."""

import pytest
import torch

from core_ops.reference.compact_state import (BLOCK, blocks_of, dequantize, dynamic_map, flat,
                                              join_master, midpoints, quantize, split_master)


def floats(bits):
    bits = torch.as_tensor(bits, dtype=torch.int64)
    return torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(torch.float32)


def bits_of(x):
    return x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


EDGES = floats([
    0x00000000, 0x80000000,              # +-0
    0x00000001, 0x807FFFFF, 0x00008001,  # subnormals, the smallest rounding up
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8001,  # largest finite: rounds to +-inf in bfloat16
    0x7F7F7FFF,                          # largest that stays finite
    0x7F800000, 0xFF800000,              # +-inf
    0x3F807FFF, 0x3F808001,              # remainder +0x7FFF, -0x7FFF: its limits
    0x3F80FFFF, 0xBF80FFFF,              # remainder -1
])


def test_remainders_give_back_every_non_tie_master_exactly():
    g = torch.Generator().manual_seed(0)
    bits = torch.cat([torch.randint(0, 2 ** 32, (1 << 20,), generator=g, dtype=torch.int64), bits_of(EDGES)])
    master = floats(bits)
    keep = ~torch.isnan(master) & ((bits & 0xFFFF) != 0x8000)
    param, remainder = split_master(master)
    assert param.dtype == torch.bfloat16 and remainder.dtype == torch.int16
    assert torch.equal(param.view(torch.int16)[keep], master.to(torch.bfloat16).view(torch.int16)[keep])
    assert torch.equal(bits_of(join_master(param, remainder))[keep], bits[keep])


def test_a_tie_moves_one_ulp_towards_its_param_and_keeps_the_param():
    # 2**16 + 1 masters round to an even bfloat16 value: the two ties at +-0x8000 cannot
    # both be told apart in 16 bits. Each comes back one float32 ulp towards the param.
    ties = floats([0x3F808000, 0x3F818000, 0xBF808000, 0x00008000, 0x7F7F8000, 0x80018000])
    param, remainder = split_master(ties)
    assert torch.equal(param.view(torch.int16), ties.to(torch.bfloat16).view(torch.int16))
    back = join_master(param, remainder)
    assert torch.equal(back.to(torch.bfloat16).view(torch.int16), param.view(torch.int16))
    assert (bits_of(back) - bits_of(ties)).abs().tolist() == [1] * 6
    towards = (back.double() - ties.double()).sign() == (param.double() - ties.double()).sign()
    assert bool(towards.all())


def test_nan_master_stays_nan():
    master = floats([0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7FBF8000])
    param, remainder = split_master(master)
    assert torch.isnan(join_master(param, remainder)).all()
    assert torch.equal(remainder, torch.zeros(4, dtype=torch.int16))


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_dynamic_maps(signed):
    qmap = dynamic_map(signed)
    assert qmap.dtype == torch.float32 and qmap.shape == (256,)
    assert bool((qmap[1:] > qmap[:-1]).all())
    assert 0.0 in qmap.tolist() and qmap.max().item() == 1.0
    assert qmap.min().item() == (pytest.approx(-0.993, abs=1e-3) if signed else 0.0)
    # Every decade from 1e-6 to 1 holds codes: small values in a block keep digits.
    positive = qmap[qmap > 0]
    for k in range(-6, 0):
        assert bool(((positive >= 10.0 ** k) & (positive < 10.0 ** (k + 1))).any()), k


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_codes_are_the_nearest_map_value(signed):
    qmap = dynamic_map(signed)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5 * BLOCK + 17, generator=g) * torch.logspace(-7, 0, 5 * BLOCK + 17)
    x = x if signed else x.abs()
    codes, absmax = quantize(x, qmap)
    assert codes.dtype == torch.uint8 and absmax.shape == (blocks_of(x.numel()),)
    scale = absmax.repeat_interleave(BLOCK)[:x.numel()]
    normalized = x * torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    distance = (normalized[:, None] - qmap[None, :]).abs()
    chosen = distance.gather(1, codes.long()[:, None])[:, 0]
    assert bool((chosen <= distance.min(dim=1).values).all())  # nearest (a tie either way)


def test_quantization_error_is_half_a_map_gap_of_the_block_maximum():
    qmap = dynamic_map(True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(10 * BLOCK, generator=g)
    codes, absmax = quantize(x, qmap)
    back = dequantize(codes, absmax, qmap)
    # The widest gap is near +-1; -1 (a block whose largest magnitude is negative) is
    # not in the map either and lies that half gap from -0.993 (to float rounding).
    gap = (qmap[1:] - qmap[:-1]).max().item()
    scale = absmax.repeat_interleave(BLOCK)
    assert bool(((back - x).abs() <= gap / 2 * scale * (1 + 1e-5)).all())
    # Each block's maximum comes back exactly (1.0 is in the map); -max as -0.993.
    top = x.view(-1, BLOCK).abs().argmax(dim=1) + torch.arange(10) * BLOCK
    positive = x[top] > 0
    assert torch.equal(back[top][positive], x[top][positive])


def test_zero_blocks_and_a_partial_last_block():
    qmap = dynamic_map(False)
    x = torch.zeros(2 * BLOCK + 3)
    x[-3:] = torch.tensor([1e-3, 2e-3, 4e-3])
    codes, absmax = quantize(x, qmap)
    assert absmax.tolist() == [0.0, 0.0, pytest.approx(4e-3)]
    back = dequantize(codes, absmax, qmap)
    assert torch.equal(back[:-3], torch.zeros(2 * BLOCK))
    torch.testing.assert_close(back[-3:], x[-3:], rtol=0.02, atol=0)


def test_midpoints_are_the_kernels_float32_formula():
    qmap = dynamic_map(True)
    mids = midpoints(qmap)
    assert mids.dtype == torch.float32
    assert torch.equal(mids, (qmap[:-1] + qmap[1:]) * torch.tensor(0.5))


def test_flat_walks_memory_order():
    t = torch.arange(24.0).reshape(1, 2, 3, 4).to(memory_format=torch.channels_last)
    assert torch.equal(flat(t), t.permute(0, 2, 3, 1).reshape(-1))
