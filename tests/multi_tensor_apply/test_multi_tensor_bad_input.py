"""Malformed calls raise TypeError / ValueError naming the argument; nothing is written."""

import pytest
import torch

import core_ops
from core_ops.multi_tensor_apply import ops
from core_ops.reference import KERNELS as REF
from core_ops._schemas import op


@pytest.fixture(params=["native", "reference"])
def backend(request, monkeypatch):
    """Runs a test through the native CPU kernels and again through the reference
    kernels: both make the per-tensor checks, with the same wording."""
    if request.param == "reference":
        monkeypatch.setattr(ops, "op", lambda name: REF[name])
    return request.param


def f32(*shape):
    return torch.zeros(*shape)


@pytest.mark.parametrize("call,exc,message", [
    (lambda: core_ops.multi_tensor_scale([f32(3)], [f32(3), f32(3)], 1.0), ValueError, "dst has 2 tensors but src has 1"),
    (lambda: core_ops.multi_tensor_scale([f32(3)], [f32(4)], 1.0), ValueError, r"dst\[0\] has shape \[4\] but src\[0\] has shape \[3\]"),
    (lambda: core_ops.multi_tensor_scale(f32(3), [f32(3)], 1.0), TypeError, "src must be a list of tensors"),
    (lambda: core_ops.multi_tensor_scale([f32(3), 2.0], [f32(3), f32(1)], 1.0), TypeError, r"src\[1\] must be a tensor"),
    (lambda: core_ops.multi_tensor_scale([torch.zeros(3, dtype=torch.int64)], [f32(3)], 1.0), TypeError, "src: expected float32, float16, bfloat16 or float64 tensors, got"),
    (lambda: core_ops.multi_tensor_scale([torch.zeros(3, dtype=torch.complex64)], [f32(3)], 1.0), TypeError, "got torch.complex64"),
    (lambda: core_ops.multi_tensor_scale([f32(3), f32(3).half()], [f32(3), f32(3)], 1.0), TypeError, r"src\[1\] has dtype torch.float16 but src\[0\] has torch.float32"),
    (lambda: core_ops.multi_tensor_scale([f32(3).double()], [f32(3)], 1.0), TypeError, "float64 lists cannot be mixed"),
    (lambda: core_ops.multi_tensor_scale([f32(3)], [f32(3)], "2"), TypeError, "scale must be a number"),
    (lambda: core_ops.multi_tensor_scale([f32(3)], [f32(3)], torch.ones(2)), ValueError, r"scale must be a one-element tensor, got shape \[2\]"),
    (lambda: core_ops.multi_tensor_scale([f32(3)], [f32(3)], 1.0, found_inf=torch.zeros(2)), ValueError, "found_inf must be a one-element"),
    (lambda: core_ops.multi_tensor_scale([f32(3)], [f32(3)], 1.0, found_inf=torch.zeros(1, dtype=torch.int64)), TypeError, "found_inf must be float32 or int32, got torch.int64"),
    (lambda: core_ops.multi_tensor_scale([torch.zeros(3).to_sparse()], [f32(3)], 1.0), TypeError, "sparse"),
    (lambda: core_ops.multi_tensor_axpby([f32(3)], [f32(3)], [f32(3)], 1, 1, arg_to_check=2), ValueError, "arg_to_check"),
    (lambda: core_ops.multi_tensor_axpby([f32(3)], [f32(2)], [f32(3)], 1, 1), ValueError, r"y\[0\] has shape \[2\]"),
    (lambda: core_ops.multi_tensor_l2norm([f32(3), "x"]), TypeError, r"tensors\[1\] must be a tensor"),
    (lambda: core_ops.multi_tensor_check_finite([f32(3), f32(3).half()]), TypeError, r"tensors\[1\] has dtype torch.float16"),
    (lambda: core_ops.multi_tensor_check_finite([f32(3)], found_inf=torch.zeros(2)), ValueError, "found_inf must be a one-element"),
    (lambda: core_ops.update_scale(torch.ones(1), torch.zeros(1), None), TypeError, "growth_tracker must be a one-element int32 tensor"),
    (lambda: core_ops.update_scale(torch.ones(1), torch.zeros(1, dtype=torch.int32), None, hysteresis=2), ValueError, "hysteresis_tracker"),
    (lambda: core_ops.update_scale(torch.ones(1), torch.zeros(1, dtype=torch.int32), None, backoff_factor=2.0), ValueError, "backoff_factor"),
])
def test_bad_input_is_named(backend, call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_mixed_devices_are_rejected(backend):
    meta = torch.zeros(3, device="meta")
    with pytest.raises(ValueError, match=r"src\[1\] is on meta but the op runs on cpu"):
        core_ops.multi_tensor_scale([f32(3), meta], [f32(3), f32(3)], 1.0)
    with pytest.raises(ValueError, match=r"dst\[0\] is on meta but the op runs on cpu"):
        core_ops.multi_tensor_scale([f32(3)], [meta], 1.0)


def test_outputs_partly_overlapping_their_inputs_are_rejected(backend):
    # A shifted view: the native kernels' result depended on the thread order.
    b = torch.arange(40000.0)
    with pytest.raises(ValueError, match=r"dst\[0\] partly overlaps src\[0\] in memory"):
        core_ops.multi_tensor_scale([b[:-1]], [b[1:]], 1.0)
    with pytest.raises(ValueError, match=r"out\[0\] partly overlaps y\[0\] in memory"):
        core_ops.multi_tensor_axpby([f32(8)], [b[:8]], [b[4:12]], 1.0, 1.0)
    assert torch.equal(b, torch.arange(40000.0))
    m = torch.arange(16.0).reshape(4, 4)  # one memory range walked in another order
    with pytest.raises(ValueError, match=r"dst\[0\] partly overlaps src\[0\] in memory"):
        core_ops.multi_tensor_scale([m], [m.t()], 1.0)
    # In place, and disjoint views of one buffer, are fine.
    core_ops.multi_tensor_scale([b], [b], 2.0)
    core_ops.multi_tensor_scale([b[:20000]], [b[20000:]], 0.5)
    assert torch.equal(b[20000:], torch.arange(20000.0)) and torch.equal(b[:20000], torch.arange(0.0, 40000.0, 2.0))


def test_rejected_call_writes_nothing(backend):
    dst = [torch.full((3,), 7.0), torch.full((3,), 7.0)]
    with pytest.raises(TypeError):
        core_ops.multi_tensor_scale([f32(3), torch.zeros(3, dtype=torch.int32)], dst, 2.0)
    assert all(torch.equal(d, torch.full((3,), 7.0)) for d in dst)


def test_native_op_called_directly_guards_memory():
    # Bypassing the Python checks must still not read or write out of bounds.
    from core_ops import native
    assert native.ensure("cpu").native
    with pytest.raises(ValueError, match="shape"):
        op("multi_tensor_scale_")([f32(8)], [f32(4)], torch.ones(1), torch.zeros(1))
    with pytest.raises(ValueError, match="tensors"):
        op("multi_tensor_axpby_")([f32(4)], [f32(4), f32(4)], [f32(4)], 1.0, 1.0, torch.zeros(1), -1)
