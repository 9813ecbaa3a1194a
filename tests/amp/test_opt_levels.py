"""The opt-level table is Apex's, explicit arguments override it, and the
combinations Apex rejected raise."""

import pytest
import torch

from core_ops.amp import opt_levels
from core_ops.amp.opt_levels import resolve

APEX_TABLE = {
    # level: cast_model_type, patch_torch_functions, keep_batchnorm_fp32, master_weights, loss_scale
    "O0": (torch.float32, False, None, False, 1.0),
    "O1": (None, True, None, None, "dynamic"),
    "O2": ("half", False, True, True, "dynamic"),
    "O3": ("half", False, False, False, 1.0),
}


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("level", list(APEX_TABLE))
def test_table(level, half):
    p = resolve(level, half)
    cast, patch, keep_bn, masters, scale = APEX_TABLE[level]
    assert p.cast_model_type == (half if cast == "half" else cast)
    assert (p.patch_torch_functions, p.keep_batchnorm_fp32, p.master_weights, p.loss_scale) == (
        patch, keep_bn, masters, scale)
    assert p.half_dtype == half
    assert p.dynamic == (scale == "dynamic")


def test_overrides_apply():
    p = resolve("O2", loss_scale=128, keep_batchnorm_fp32="False", cast_model_outputs=torch.float16)
    assert p.loss_scale == 128.0 and not p.dynamic
    assert p.keep_batchnorm_fp32 is False and p.master_weights is True
    assert p.cast_model_outputs == torch.float16
    p = resolve("O3", keep_batchnorm_fp32=True, loss_scale="dynamic")
    assert p.keep_batchnorm_fp32 is True and p.dynamic
    p = resolve("O1", loss_scale=1.0, cast_model_type=torch.float32)
    assert p.loss_scale == 1.0 and p.patch_torch_functions


def test_none_means_level_default():
    assert resolve("O2", keep_batchnorm_fp32=None, master_weights=None) == resolve("O2")


def test_cast_model_type_picks_the_half_dtype():
    p = resolve("O2", torch.bfloat16, cast_model_type=torch.float16)
    assert p.half_dtype == torch.float16 and p.cast_model_type == torch.float16


@pytest.mark.parametrize("level, kwargs, match", [
    ("O1", dict(cast_model_type=torch.float16), "O1 runs the model's forward under torch.autocast"),
    ("O1", dict(keep_batchnorm_fp32=True), r"leave keep_batchnorm_fp32 unset \(keep_batchnorm_fp32=True\)"),
    ("O1", dict(master_weights=True), "master_weights makes no sense"),
    ("O2", dict(patch_torch_functions=True), "belongs to opt_level='O1'"),
    ("O0", dict(master_weights=True), "master_weights=True needs a model cast"),
    ("O2", dict(keep_batchnorm_fp32="maybe"), "keep_batchnorm_fp32='maybe': expected one of 1, true"),
    ("O2", dict(loss_scale="auto"), "loss_scale='auto': expected 'dynamic' or a number > 0"),
    ("O2", dict(loss_scale=-1), "loss_scale=-1: expected 'dynamic' or a number > 0"),
    ("O2", dict(cast_model_type=torch.int8), "cast_model_type must be a floating torch.dtype"),
])
def test_inconsistent_combinations_raise(level, kwargs, match):
    with pytest.raises(ValueError, match=match):
        resolve(level, **kwargs)


def test_unknown_level_and_dtype():
    with pytest.raises(ValueError, match=r"opt_level='02': expected one of O0, O1, O2, O3 \(the letter O, not the digit 0\)"):
        resolve("02")
    with pytest.raises(ValueError, match="opt_level='O4': expected one of O0, O1, O2, O3"):
        resolve("O4")
    with pytest.raises(ValueError, match=r"half_dtype=torch.float32: expected fp16 or bf16 \(torch.float16 / torch.bfloat16\)"):
        resolve("O2", torch.float32)
    assert opt_levels.half_dtype_of("bf16") == torch.bfloat16
