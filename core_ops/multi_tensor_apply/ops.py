"""The multi-tensor ops as plain functions: validate, make native kernels available,
dispatch. See Note [Multi-tensor conventions] in ``core_ops/_schemas.py``."""

import math

import torch

from .. import _validate, native
from .._boundary import check_call, check_no_grad_writes
from .._schemas import op
from .._sharded import is_sharded, locals_of, whole_norms

# The public ops (core_ops exports them at its top level too).
__all__ = ["clip_grad_norm_", "multi_tensor_axpby", "multi_tensor_check_finite", "multi_tensor_l2norm",
           "multi_tensor_scale", "multi_tensor_unscale_l2norm", "update_scale"]


def _prepare(*named_lists, writes=(), op_name=""):
    """Cheap checks, then the device's native kernels made available if they can be.
    ``writes``: the names of the lists the op writes (Note [Op boundary])."""
    lists = [_validate.tensor_list(ts, name) for name, ts in named_lists]
    check_no_grad_writes(op_name, [(name, ts) for (name, _), ts in zip(named_lists, lists) if name in writes])
    ref_name, ref = named_lists[0][0], lists[0]
    for (name, _), ts in zip(named_lists[1:], lists[1:]):
        _validate.same_length(ref, ref_name, ts, name)
    device = ref[0].device if ref else torch.device("cpu")
    native.ensure_for(device)
    return lists, device


def _call(name, lists, *args):
    """``op(name)(*args)``, or for empty ``lists`` only the checks the op makes of every
    call (Note [Op boundary]: a meta scale beside a CPU flag is refused either way);
    an empty call then does nothing, without a dispatch."""
    if lists:
        op(name)(*args)
    else:
        check_call(name, args, {})


def _scalar_dtype(tensors):
    # The dtype the kernels compute in (Note [Multi-tensor conventions]).
    return torch.float64 if tensors and tensors[0].dtype == torch.float64 else torch.float32


def multi_tensor_scale(src, dst, scale, found_inf=None):
    """``dst[i] = src[i] * scale`` for every i; sets ``found_inf`` (returned) to 1 if any
    element of ``src`` is inf or nan. ``scale`` is a number or a one-element tensor on
    the tensors' device (no host sync). ``dst`` may be ``src`` (in place)."""
    (src, dst), device = _prepare(("src", src), ("dst", dst), writes=("dst",), op_name="multi_tensor_scale")
    found_inf = _validate.flag(found_inf, device)
    scale = _validate.scalar_tensor(scale, device, "scale", _scalar_dtype(src))
    _call("multi_tensor_scale_", src, src, dst, scale, found_inf)
    return found_inf


def multi_tensor_check_finite(tensors, found_inf=None):
    """Sets ``found_inf`` (returned) to 1 if any element of ``tensors`` is inf or nan;
    reads the tensors and writes nothing else. Unlike testing a norm for inf, large
    finite values never raise the flag."""
    (tensors,), device = _prepare(("tensors", tensors))
    found_inf = _validate.flag(found_inf, device)
    _call("multi_tensor_check_finite_", tensors, tensors, found_inf)
    return found_inf


def multi_tensor_axpby(x, y, out, a, b, found_inf=None, arg_to_check=-1):
    """``out[i] = a * x[i] + b * y[i]``; sets ``found_inf`` (returned) if the inputs
    chosen by ``arg_to_check`` (-1 both, 0 x, 1 y; Apex's meaning) hold inf or nan."""
    if arg_to_check not in (-1, 0, 1):
        raise ValueError(f"arg_to_check must be -1 (both), 0 (x) or 1 (y), got {arg_to_check!r}")
    (x, y, out), device = _prepare(("x", x), ("y", y), ("out", out), writes=("out",), op_name="multi_tensor_axpby")
    found_inf = _validate.flag(found_inf, device)
    _call("multi_tensor_axpby_", x, x, y, out, float(a), float(b), found_inf, arg_to_check)
    return found_inf


def multi_tensor_l2norm(tensors, per_tensor=False):
    """The L2 norm of all elements of ``tensors`` together, and if ``per_tensor`` the
    norm of each (else an empty tensor). Accumulated and returned in float32
    (float64 for float64 inputs), as 0-d and 1-d tensors on the tensors' device."""
    (tensors,), _ = _prepare(("tensors", tensors))
    return op("multi_tensor_l2norm")(tensors, bool(per_tensor))


def global_l2norm(lists, where=""):
    """The L2 norm of every tensor of ``lists`` (non-empty lists of one device and dtype
    each) together: one norm pass a list, then their norms combined, in float32
    (float64 if any list is). DTensors (FSDP2's sharded grads) count whole: each
    tensor's norm from its local shard, reduced over the ranks holding the rest in one
    collective (Note [Sharded params] in core_ops/_sharded.py)."""
    sharded = any(is_sharded(t) for ts in lists for t in ts)
    norms = [multi_tensor_l2norm(locals_of(ts), per_tensor=sharded)[1 if sharded else 0] for ts in lists]
    device = norms[0].device
    dtype = torch.float64 if any(n.dtype == torch.float64 for n in norms) else torch.float32
    norms = torch.cat([n.to(device, dtype).reshape(-1) for n in norms])
    if sharded:
        norms = whole_norms([t for ts in lists for t in ts], norms, where=where)
    return torch.linalg.vector_norm(norms)


def clip_grad_norm_(grads, max_norm, eps=1e-6):
    """Scales ``grads`` in place by ``min(1, max_norm / (norm + eps))``, ``norm`` their
    global L2 norm, as ``torch.nn.utils.clip_grad_norm_`` does to the grads of its
    params: one multi-tensor norm pass and one scaling pass per (device, dtype) group,
    no host sync. Returns the norm (0-d float32, float64 if any grad is; on the first
    grad's device); it is inf or nan when a grad is."""
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    groups = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    if not groups:
        return torch.zeros(())
    total = global_l2norm(list(groups.values()), where="clip_grad_norm_: ")
    clip = torch.clamp(max_norm / (total + eps), max=1.0)
    for (group_device, _), gs in groups.items():
        multi_tensor_scale(locals_of(gs), locals_of(gs), clip.to(group_device))
    return total


def per_tensor_norms(tensors, norm_type, dtype):
    """One norm per tensor, L2 (``norm_type`` 2) or max|t| (0), as a ``dtype`` tensor on
    the tensors' device (no host sync): NovoGrad's layer norms."""
    if norm_type == 2:
        return multi_tensor_l2norm(tensors, per_tensor=True)[1].to(dtype)
    # max|t| is exact in the tensors' dtype; an empty tensor's is 0 (amax refuses those).
    return torch.stack([t.abs().amax() if t.numel() else t.new_zeros(()) for t in tensors]).to(dtype)


def multi_tensor_unscale_l2norm(tensors, inv_scale, found_inf=None, per_tensor=False):
    """In one pass: ``t *= inv_scale`` in place for every tensor, the L2 norms of the
    unscaled values (as ``multi_tensor_l2norm``), and ``found_inf`` set if any input
    element was inf or nan. Returns ``(total_norm, per_tensor_norms, found_inf)``."""
    (tensors,), device = _prepare(("tensors", tensors), writes=("tensors",), op_name="multi_tensor_unscale_l2norm")
    found_inf = _validate.flag(found_inf, device)
    inv_scale = _validate.scalar_tensor(inv_scale, device, "inv_scale", _scalar_dtype(tensors))
    total, per = op("multi_tensor_unscale_l2norm_")(tensors, inv_scale, found_inf, bool(per_tensor))
    return total, per, found_inf


def update_scale(scale, growth_tracker, found_inf, *, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, hysteresis=1, hysteresis_tracker=None,
                 min_scale=0.0, max_scale=math.inf):
    """The dynamic loss-scale update, in place on device tensors with no host sync
    (Note [Loss-scale update] in ``core_ops/reference/loss_scale.py``). ``scale`` is a
    one-element float32 tensor, the trackers one-element int32 tensors. Returns scale."""
    for name, t in (("scale", scale), ("growth_tracker", growth_tracker)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    device = scale.device
    check_no_grad_writes("update_scale", [("scale", scale)])
    found_inf = _validate.flag(found_inf, device)
    if hysteresis_tracker is None:
        if hysteresis != 1:
            raise ValueError("hysteresis > 1 needs a hysteresis_tracker tensor that "
                             "persists across steps")
        hysteresis_tracker = torch.ones(1, dtype=torch.int32, device=device)
    native.ensure_for(device)
    op("update_scale_")(scale, growth_tracker, hysteresis_tracker, found_inf, float(growth_factor),
                        float(backoff_factor), int(growth_interval), int(hysteresis),
                        float(min_scale), float(max_scale))
    return scale
