"""fused_adam_compact_'s CUDA kernel (GPU machines only) against its native CPU kernel,
bit for bit (Note [CUDA optimizer tolerances] in test_fused_adam_cuda.py: one math
header, the same roundings; the codes are the same count of midpoints, found by a
table on the CPU and a binary search on the GPU), for every state layout, sizes that
straddle a block of 8-bit moments and a CUDA chunk, channels_last memory, grad_scale
and a skipped step; and FusedAdam with remainders on CUDA against fp32 masters."""

import copy

import pytest
import torch
from cuda_cases import _both_native  # noqa: F401  (autouse: both native libraries loaded)
from test_fused_adam_compact import (HYPER, bf16_params, clone, compact_lists, equal_bits, grads_for,
                                     stepped)

from core_ops._library import op
from core_ops.optimizers import FusedAdam
from core_ops.reference.compact_state import dynamic_map

pytestmark = pytest.mark.gpu

SIZES = (1, 255, 256, 257, 4097, 65535, 2 * 65536 + 5)


def on(lists, device):
    return [[t.to(device) for t in ts] for ts in lists]


@pytest.mark.parametrize("moments", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("weights,param_dtype", [("remainder", torch.bfloat16), ("master", torch.float16),
                                                 ("none", torch.float32), ("none", torch.bfloat16)],
                         ids=["remainder", "fp16-master", "fp32", "bf16"])
@pytest.mark.parametrize("scaled", [False, True], ids=["", "grad_scale"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["", "channels_last"])
def test_cuda_kernel_is_the_cpu_kernel_bit_for_bit(moments, weights, param_dtype, scaled, channels_last):
    lists = compact_lists(moments, weights, param_dtype, sizes=SIZES, channels_last=channels_last)
    cpu, gpu = copy.deepcopy(lists), on(lists, "cuda")
    maps = (dynamic_map(True), dynamic_map(False)) if moments == "int8" else (None, None)
    for ls, device in ((cpu, "cpu"), (gpu, "cuda")):
        scale = torch.tensor([8.0], device=device) if scaled else None
        m = tuple(x.to(device) if x is not None else None for x in maps)
        for _ in range(3):
            op("fused_adam_compact_")(*ls, *m, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True, False, None, scale, None)
    for name, a_list, b_list in zip(("params", "grads", "exp_avgs", "exp_avg_sqs", "exp_avg_absmaxes",
                                     "exp_avg_sq_absmaxes", "master_params", "steps"), cpu, gpu):
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            assert equal_bits(a, b.cpu()), (name, i)


def test_cuda_skipped_step_changes_nothing():
    lists = on(compact_lists("int8", "remainder", torch.bfloat16, sizes=SIZES), "cuda")
    before = copy.deepcopy(lists)
    maps = dynamic_map(True).cuda(), dynamic_map(False).cuda()
    op("fused_adam_compact_")(*lists, *maps, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True, False, None,
                              torch.tensor([4.0], device="cuda"), torch.ones(1, device="cuda"))
    for a_list, b_list in zip(lists, before):
        assert all(equal_bits(a, b) for a, b in zip(a_list, b_list))


def test_cuda_remainders_step_as_fp32_masters():
    params = [p.cuda().detach().requires_grad_() for p in bf16_params()]
    ref, ours = clone(params), clone(params)
    grads = [[g.cuda() for g in gs] for gs in grads_for(params, 30)]
    a = FusedAdam(ref, master_weights=True, **HYPER)
    b = FusedAdam(ours, master_weights="remainder", state_dtype="int8", **HYPER)
    c = FusedAdam(clone(params), master_weights="remainder", **HYPER)
    stepped(b, ours, grads)
    c_params = c.param_groups[0]["params"]
    for x, y in zip(stepped(a, ref, grads), stepped(c, c_params, grads)):
        assert all(equal_bits(p, q) for p, q in zip(x, y))
    assert b.state[ours[-1]]["exp_avg"].dtype == torch.uint8
