"""The user-facing argument checks of the multi-tensor ops: one place, every backend.

They raise TypeError for a wrong kind of thing (not a list, not a tensor, an integer
or complex dtype) and ValueError for a wrong arrangement (lengths, shapes, devices),
naming the argument and the index. The C++ kernels repeat the few checks that guard
memory safety, for callers that reach ``torch.ops.core_ops`` directly.
"""

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def tensor_list(value, name):
    """``value`` as a list of dense floating tensors of one dtype and device."""
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of tensors, got {type(value).__name__}")
    ts = list(value)
    for i, t in enumerate(ts):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a tensor, got {type(t).__name__}")
    if not ts:
        return ts
    dtypes = {t.dtype for t in ts}
    devices = {t.device for t in ts}
    if len(dtypes) > 1 or len(devices) > 1 or any(t.layout != torch.strided for t in ts):
        _explain_mixed(ts, name)
    dtype = ts[0].dtype
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {dtype}; expected float32, float16, bfloat16 "
                        "or float64")
    return ts


def _explain_mixed(ts, name):
    first = ts[0]
    for i, t in enumerate(ts):
        if t.layout != torch.strided:
            raise TypeError(f"{name}[{i}] is a {t.layout} tensor; only dense tensors are "
                            "supported (sparse gradients cannot be fused)")
        if t.device != first.device:
            raise ValueError(f"{name}[{i}] is on {t.device} but {name}[0] is on "
                             f"{first.device}; one list must be on one device")
        if t.dtype != first.dtype:
            raise TypeError(f"{name}[{i}] has dtype {t.dtype} but {name}[0] has "
                            f"{first.dtype}; group tensors by dtype first")


def same_structure(ref, ref_name, other, other_name):
    """``other`` matches ``ref`` in length, device and per-index shape."""
    if len(other) != len(ref):
        raise ValueError(f"{other_name} has {len(other)} tensors but {ref_name} has {len(ref)}")
    if ref and other and other[0].device != ref[0].device:
        raise ValueError(f"{other_name} is on {other[0].device} but {ref_name} is on "
                         f"{ref[0].device}")
    for i, (a, b) in enumerate(zip(ref, other)):
        if a.shape != b.shape:
            raise ValueError(f"{other_name}[{i}] has shape {tuple(b.shape)} but "
                             f"{ref_name}[{i}] has shape {tuple(a.shape)}")


def no_float64_mix(*named_lists):
    kinds = {ts[0].dtype == torch.float64 for _, ts in named_lists if ts}
    if len(kinds) > 1:
        names = ", ".join(n for n, _ in named_lists)
        raise TypeError(f"{names}: float64 lists cannot be mixed with reduced-precision "
                        "lists in one call")


def flag(found_inf, device, name="found_inf"):
    """A found-inf / noop flag: a new zeroed float32 one, or the caller's, checked."""
    if found_inf is None:
        return torch.zeros(1, dtype=torch.float32, device=device)
    if not isinstance(found_inf, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(found_inf).__name__}")
    if found_inf.numel() != 1 or found_inf.dtype not in (torch.float32, torch.int32):
        raise ValueError(f"{name} must be a one-element float32 or int32 tensor, got "
                         f"shape {tuple(found_inf.shape)} dtype {found_inf.dtype}")
    if found_inf.device != device:
        raise ValueError(f"{name} is on {found_inf.device} but the tensors are on {device}")
    return found_inf


def scalar_tensor(value, device, name):
    """A float32 one-element tensor on ``device`` from a number or such a tensor."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor, got shape "
                             f"{tuple(value.shape)}")
        if value.device != device:
            raise ValueError(f"{name} is on {value.device} but the tensors are on {device}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or a one-element tensor, got "
                        f"{type(value).__name__}")
    return torch.full((1,), float(value), dtype=torch.float32, device=device)
