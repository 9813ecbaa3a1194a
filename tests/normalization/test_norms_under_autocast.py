"""Apex's fused norms under torch.autocast run in the autocast dtype (Note [Norms under
autocast] in core_ops/normalization/functional.py), as Megatron and NeMo expect;
outside autocast they keep their dtypes. Values: the norm computed in float64 from
the inputs as cast to the autocast dtype, within one rounding of that dtype (the
statistics are float32, rtol 2 ulps of the output)."""

import pytest
import torch
import torch.nn.functional as F

from core_ops import normalization as N

SHAPE = (32, 16)
ULPS = {torch.float16: 2 * 2.0**-10, torch.bfloat16: 2 * 2.0**-7}


def reference(kind, x, weight, bias):
    x, w = x.double(), None if weight is None else weight.double()
    if kind == "layer":
        return F.layer_norm(x, SHAPE, w, None if bias is None else bias.double(), 1e-5)
    return F.rms_norm(x, SHAPE, w, 1e-5)


MODULES = {
    "FusedLayerNorm": ("layer", lambda: N.FusedLayerNorm(SHAPE)),
    "FusedLayerNorm-no-affine": ("layer", lambda: N.FusedLayerNorm(SHAPE, elementwise_affine=False)),
    "MixedFusedLayerNorm": ("layer", lambda: N.MixedFusedLayerNorm(SHAPE)),
    "FusedRMSNorm": ("rms", lambda: N.FusedRMSNorm(SHAPE)),
    "MixedFusedRMSNorm": ("rms", lambda: N.MixedFusedRMSNorm(SHAPE)),
}


def module_with_weights(make):
    module = make()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(MODULES))
def test_modules_run_in_the_autocast_dtype(name, dtype):
    kind, make = MODULES[name]
    module = module_with_weights(make)
    x = torch.randn(8, *SHAPE, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        y = module(x)
    assert y.dtype == dtype
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    cast = [None if t is None else t.detach().to(dtype) for t in (x, weight, bias)]
    want = reference(kind, *cast)
    torch.testing.assert_close(y.double(), want, rtol=ULPS[dtype], atol=ULPS[dtype])
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
    assert all(p.grad.dtype == torch.float32 for p in module.parameters())
    assert module(x).dtype == torch.float32  # outside autocast: as before


@pytest.mark.parametrize("fn, args", [
    (N.fused_layer_norm_affine, ("w", "b")), (N.fused_layer_norm, ()),
    (N.fused_rms_norm_affine, ("w",)), (N.fused_rms_norm, ()),
    (N.mixed_dtype_fused_layer_norm_affine, ("w", "b")),
    (N.mixed_dtype_fused_rms_norm_affine, ("w",)),
    (N.FusedLayerNormAffineFunction.apply, ("w", "b")), (N.FusedRMSNormAffineFunction.apply, ("w",)),
], ids=lambda v: getattr(v, "__qualname__", "") if callable(v) else "")
def test_functional_forms_run_in_the_autocast_dtype(fn, args):
    x, w, b = torch.randn(4, *SHAPE), torch.randn(SHAPE), torch.randn(SHAPE)
    given = [{"w": w, "b": b}[a] for a in args]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fn(x, *given, SHAPE, 1e-5).dtype == torch.bfloat16
    assert fn(x, *given, SHAPE, 1e-5).dtype == torch.float32
    assert fn(x.bfloat16(), *given, SHAPE, 1e-5).dtype == (
        torch.float32 if "mixed" in getattr(fn, "__name__", "") else torch.bfloat16)
