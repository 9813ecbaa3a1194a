"""The argument checks of the multi-tensor ops.

They raise TypeError for a wrong kind of thing (not a list, not a tensor, an integer
or complex dtype, a sparse tensor) and ValueError for a wrong arrangement (lengths,
shapes, devices), naming the argument and the index. The public functions make the
cheap checks; the per-tensor ones (``check_lists``) run in the reference and fake
kernels here and in the C++ kernels natively, so they cost one C++ loop per call.
"""

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class SparseGradError(TypeError, RuntimeError):
    """A sparse grad given to a fused optimizer. A TypeError, as the ops' own refusal
    of a sparse tensor; also a RuntimeError, the class torch.optim and Apex raise for
    it, so code that catches theirs catches this."""


def tensor_list(value, name):
    """``value`` as a list of tensors. Cheap (one isinstance per element): the
    per-tensor checks run inside the kernels, see ``check_lists``."""
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of tensors, got {type(value).__name__}")
    ts = list(value)
    if not all(isinstance(t, torch.Tensor) for t in ts):
        i, bad = next((i, t) for i, t in enumerate(ts) if not isinstance(t, torch.Tensor))
        raise TypeError(f"{name}[{i}] must be a tensor, got {type(bad).__name__}")
    return ts


def check_arg_to_check(arg_to_check):
    """axpby's: which inputs set the flag (tensor_lists.h's words)."""
    if arg_to_check not in (-1, 0, 1):
        raise ValueError(f"arg_to_check must be -1 (both), 0 (x) or 1 (y), got {arg_to_check}")


def same_length(ref, ref_name, other, other_name):
    if len(other) != len(ref):
        raise ValueError(f"{other_name} has {len(other)} tensors but {ref_name} has {len(ref)}")


def dense(t):
    """Whether ``t`` covers its storage range with no gaps or overlaps, in some order of
    its dims (sizes of 1 and empty tensors may have any strides)."""
    if t.numel() == 0:
        return True
    expected = 1
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def same_layout(a, b):
    """Whether ``a`` and ``b``, of equal shapes, walk memory in the same order: equal
    strides on every dim of more than one element (a size-1 dim's stride is never used:
    ``torch.randn(17, 1).t()`` is contiguous with strides (1, 1))."""
    return a.stride() == b.stride() or a.numel() == 0 or all(
        sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape) if n != 1)


def check_lists(*named_lists, floating=True, doubles_apart=True):
    """The per-tensor checks, for the reference and fake kernels; the C++ kernels make
    the same checks with the same wording (core_ops/tensor_lists.h), where a Python
    loop over thousands of tensors would cost more than the op.

    Every tensor dense and on the first tensor's device; one dtype per list, floating;
    shapes equal index by index to the first list; float64 lists not mixed with others
    (``doubles_apart``; an optimizer's state says its dtype in its own words instead).
    """
    named_lists = [(n, ts) for n, ts in named_lists]
    ref_name, ref = named_lists[0]
    for name, ts in named_lists[1:]:  # lengths first, as tensor_lists.h
        same_length(ref, ref_name, ts, name)
    if not ref:
        return
    device = ref[0].device
    for name, ts in named_lists:
        for i, t in enumerate(ts):
            if t.layout != torch.strided:
                raise TypeError(f"{name}[{i}] is a {t.layout} tensor; only dense tensors are "
                                "supported (sparse gradients cannot be fused)")
            if t.device != device:
                raise ValueError(f"{name}[{i}] is on {t.device} but the op runs on {device}")
            if t.dtype != ts[0].dtype:
                raise TypeError(f"{name}[{i}] has dtype {t.dtype} but {name}[0] has "
                                f"{ts[0].dtype}; group tensors by dtype first")
            if t.shape != ref[i].shape:
                raise ValueError(f"{name}[{i}] has shape {list(t.shape)} but {ref_name}[{i}] "
                                 f"has shape {list(ref[i].shape)}")
        if floating and ts and ts[0].dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: expected float32, float16, bfloat16 or float64 "
                            f"tensors, got {ts[0].dtype}")
    doubles = {ts[0].dtype == torch.float64 for _, ts in named_lists if ts}
    if doubles_apart and len(doubles) > 1:
        names = [n for n, _ in named_lists]
        said = f"{', '.join(names[:-1])} and {names[-1]}"  # tensor_lists.h's all_or_no_double words
        raise TypeError(f"{said}: float64 lists cannot be mixed with other dtypes")


def flag(found_inf, device):
    """A found-inf flag for the public ops: a new zeroed float32 one on ``device``, or the
    caller's. Its size, dtype and device are the op's to check, in its words, as for
    every route (Note [Op boundary] in _boundary.py)."""
    if found_inf is None:
        return torch.zeros(1, dtype=torch.float32, device=device)
    if not isinstance(found_inf, torch.Tensor):
        raise TypeError(f"found_inf must be a tensor, got {type(found_inf).__name__}")
    return found_inf


def noop_flag(value, device):
    """Apex's noop_flag (amp_C): one float32 or int32 element on the tensors' device."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"noop_flag must be a tensor, got {type(value).__name__}")
    if value.numel() != 1:
        raise ValueError(f"noop_flag must be a one-element float32 or int32 tensor, got shape {tuple(value.shape)}")
    if value.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"noop_flag must be a one-element float32 or int32 tensor, got {value.dtype}")
    if device is not None and value.device != device:
        raise ValueError(f"noop_flag is on {value.device} but the tensors are on {device}")
    return value


def scalar_tensor(value, device, name, dtype=torch.float32):
    """A one-element tensor on ``device`` from a number (in ``dtype``: float64 for ops
    on float64 tensors, so a Python float is not rounded to float32), or the caller's
    tensor, whose size and device the op checks."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or a one-element tensor, got "
                        f"{type(value).__name__}")
    return torch.full((1,), float(value), dtype=dtype, device=device)


def lr_arg(lr, device):
    """``(lr, lr_tensor)`` as the fused optimizer ops take them: a float, or a
    one-element tensor on ``device`` (float64 stays float64: rounding it to float32
    would move float64 params off torch.optim's results)."""
    if isinstance(lr, torch.Tensor):
        if not (lr.is_floating_point() or lr.dtype in (torch.int32, torch.int64)):  # the ops' words
            raise TypeError(f"lr must be a floating or integer tensor, got {lr.dtype}")
        dtype = torch.float64 if lr.dtype == torch.float64 else torch.float32
        return 0.0, lr.detach().to(device=device, dtype=dtype, non_blocking=True).reshape(1)
    return float(lr), None


def state_dtype(param_dtype):
    """Optimizer state and master weights: float32, float64 for float64 params."""
    return torch.float64 if param_dtype == torch.float64 else torch.float32


def check_optimizer_lists(params, grads, steps, master_grads=False, **states):
    """The checks of a fused optimizer op (Note [Fused optimizer ops]), for the
    reference and fake kernels; csrc/include/core_ops/optimizer_args.h words the same
    checks for the C++ kernels, in their order: the params' dtype kind last, where the
    kernels find it (picking a kernel for it). ``states`` maps a list's name to the
    list, or to None for an optional list that is absent."""
    check_lists(("params", params), ("grads", grads), floating=False, doubles_apart=False)
    if not params:
        return
    masters = states.get("master_params")
    if params[0].dtype != grads[0].dtype and not (master_grads and masters and grads[0].dtype == torch.float32):
        raise TypeError(f"grads have dtype {grads[0].dtype} but params have {params[0].dtype}"
                        + (" (float32 grads are taken with master_params)" if master_grads else ""))
    if steps is not None:  # None: the optimizer keeps no step count (SGD); one each: _boundary.py
        same_length(params, "params", steps, "steps")
        for i, s in enumerate(steps):  # optimizer_args.h's words
            if s.layout != torch.strided:
                raise TypeError(f"steps[{i}] is a {s.layout} tensor; step counts must be dense")
            if s.numel() != 1 or s.dtype != torch.float32:
                raise ValueError(f"steps[{i}] must be a one-element float32 tensor on {params[0].device}")
    want = state_dtype(params[0].dtype)
    for name, ts in states.items():
        if ts is None:
            continue
        same_length(params, "params", ts, name)
        check_lists(("params", params), (name, ts), floating=False, doubles_apart=False)  # its dtype: below
        if ts[0].dtype != want:
            raise TypeError(f"{name} must be {want} for {params[0].dtype} params, got {ts[0].dtype}")
    if states.get("master_params") and params[0].dtype == torch.float64:
        raise ValueError("float64 params take no master_params")
    check_lists(("params", params), floating=True)
    check_dense_params(params)
    for i, p in enumerate(params):  # Note [Optimizer memory layout] in optimizer_args.h
        for name, ts in states.items():
            if ts and not same_layout(ts[i], p):
                raise ValueError(f"{name}[{i}] must have the strides of params[{i}] {list(p.stride())}, "
                                 f"got {list(ts[i].stride())}")


def check_lamb_norms(params, param_norms, update_norms):
    """LAMB stage 2's per-tensor norms, in optimizer_ops.h's words."""
    if not params:
        return
    want, device = state_dtype(params[0].dtype), params[0].device
    for norms in (param_norms, update_norms):
        if norms.numel() != len(params) or norms.device != device or norms.dtype != want:
            raise ValueError(f"param_norms and update_norms must hold one {want} norm per param on {device}")


def check_dense_params(params):
    for i, p in enumerate(params):
        if not dense(p):
            raise ValueError(f"params[{i}] must be dense (contiguous or a permutation of it), got strides "
                             f"{list(p.stride())}")


def check_per_tensor_state(params, exp_avg_sqs, grad_norms):
    """NovoGrad's one value per param: exp_avg_sqs one-element tensors, grad_norms one
    tensor of len(params) norms, in the state dtype on the params' device; in the words
    of optimizer_ops.h's check_novograd_per_tensor_state."""
    if not params:
        return
    want, device = state_dtype(params[0].dtype), params[0].device
    same_length(params, "params", exp_avg_sqs, "exp_avg_sqs")
    for i, t in enumerate(exp_avg_sqs):
        if t.layout != torch.strided:
            raise TypeError(f"exp_avg_sqs[{i}] is a {t.layout} tensor; only dense tensors are supported")
        if t.device != device:
            raise ValueError(f"exp_avg_sqs[{i}] is on {t.device} but the op runs on {device}")
    for i, t in enumerate(exp_avg_sqs):
        if t.numel() != 1 or t.device != device or t.dtype != want:
            raise ValueError(f"exp_avg_sqs[{i}] must be a one-element {want} tensor on {device}")
    if grad_norms.numel() != len(params) or grad_norms.device != device or grad_norms.dtype != want:
        raise ValueError(f"grad_norms must hold one {want} norm per param on {device}")


def batch_norm_acc_dtype(input_dtype):
    """The dtype the batch-norm statistics are kept in: float64 for float64 input, else
    float32 (Note [Sync batch norm ops] in _schemas.py)."""
    return torch.float64 if input_dtype == torch.float64 else torch.float32


def check_batch_norm_args(input, *, grad_out=None, stats=(), weight=None, bias=None):
    """The checks of the sync batch-norm ops, for the reference and fake kernels;
    csrc/cpu/sync_batch_norm.cpp words the same checks for the C++ kernels.

    ``input`` is (N, C, *) with N >= 0; ``stats`` are (name, tensor) pairs of per-channel
    (C,) tensors in the accumulation dtype; weight / bias are (C,) of any float dtype."""
    if input.dim() < 2:
        raise ValueError(f"input must have at least 2 dimensions (N, C, ...), got shape "
                         f"{tuple(input.shape)}")
    if input.dtype not in FLOAT_DTYPES:
        raise TypeError(f"input: expected float32, float16, bfloat16 or float64, got {input.dtype}")
    channels, acc = input.shape[1], batch_norm_acc_dtype(input.dtype)
    if grad_out is not None and (grad_out.shape != input.shape or grad_out.dtype != input.dtype
                                 or grad_out.device != input.device):
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)} and dtype {grad_out.dtype} on "
                         f"{grad_out.device} but input has {tuple(input.shape)} and {input.dtype} on {input.device}")
    for name, t in stats:
        if t.shape != (channels,) or t.dtype != acc or t.device != input.device:
            raise ValueError(f"{name} must be a ({channels},) {acc} tensor on {input.device}, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.shape != (channels,) or t.dtype not in FLOAT_DTYPES
                              or t.device != input.device):
            raise ValueError(f"{name} must be a ({channels},) float tensor on {input.device}, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")


INT32_MAX = 2**31 - 1


def check_update_scale_tensors(scale, growth_tracker, hysteresis_tracker, found_inf):
    """update_scale_'s tensors, in tensor_lists.h's words (check_update_scale_args)."""
    if scale.dtype != torch.float32 or scale.numel() != 1:
        raise TypeError("scale must be a one-element float32 tensor")
    for name, t in (("growth_tracker", growth_tracker), ("hysteresis_tracker", hysteresis_tracker)):
        if t.dtype != torch.int32 or t.numel() != 1:
            raise TypeError(f"{name} must be a one-element int32 tensor")
    check_flag(found_inf)


def check_flag(found_inf):
    """A found-inf flag an op is given: one float32 or int32 element (tensor_lists.h)."""
    if found_inf.numel() != 1:
        raise ValueError(f"found_inf must be a one-element tensor, got shape {list(found_inf.shape)}")
    if found_inf.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"found_inf must be float32 or int32, got {found_inf.dtype}")


def loss_scale_args(growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale):
    """The checks of a dynamic loss scale's settings (``update_scale``, ``LossScaler``, and
    the update_scale_ op on every route: csrc/include/core_ops/tensor_lists.h words them
    the same, numbers as C++ prints them, hence ``:g``). The trackers are int32, so the
    counts stop at 2**31 - 1."""
    if not growth_factor >= 1.0:  # 1: a scale that never grows (Apex allows it)
        raise ValueError(f"growth_factor must be >= 1, got {growth_factor:g}")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor:g}")
    if not (1 <= int(growth_interval) <= INT32_MAX and 1 <= int(hysteresis) <= INT32_MAX):
        raise ValueError("growth_interval and hysteresis must be in [1, 2**31 - 1] (int32 trackers), got "
                         f"{int(growth_interval)} and {int(hysteresis)}")
    if not 0.0 <= min_scale <= max_scale:
        raise ValueError(f"need 0 <= min_scale <= max_scale, got {min_scale:g} and {max_scale:g}")


_HALF = (torch.float16, torch.bfloat16)


def check_norm_args(input, hidden, params=(), out_dtype=None, name="input"):
    """The layer / RMS norm ops' arguments (Note [Norm ops] in _schemas.py): ``input``
    floating with a whole number of rows of ``hidden`` values, params of ``hidden``
    values on its device, and an output dtype of the input's or, for half input,
    float32."""
    if not input.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {input.dtype}")
    if hidden < 1 or (input.numel() % hidden and input.numel()):
        raise ValueError(f"{name} of shape {list(input.shape)} does not hold whole rows of hidden={hidden} values")
    for pname, p in params:
        if p is None:
            continue
        if p.numel() != hidden:
            raise ValueError(f"{pname} has {p.numel()} elements; expected hidden={hidden}")
        if p.device != input.device:
            raise ValueError(f"{pname} is on {p.device}, {name} on {input.device}")
        if not p.is_floating_point():
            raise TypeError(f"{pname} must be floating-point, got {p.dtype}")
    if out_dtype is not None and out_dtype != input.dtype and not (out_dtype == torch.float32 and input.dtype in _HALF):
        raise TypeError(f"out_dtype must be {name}'s dtype ({input.dtype}) or, for half input, torch.float32; "
                        f"got {out_dtype}")


def check_norm_bwd_args(grad_out, saved, stats, hidden, dx_dtype, memory_efficient):
    """The norm backwards' other inputs: the dtypes (dx_dtype floating, grad_out the
    input's or float32 for half input, saved the input's or, memory_efficient, the
    output's), ``grad_out`` with saved's elements on its device, and each of ``stats``
    (name, tensor) one value per row in the accumulation dtype on that device: the
    kernels index them by row, unchecked. norm_args.h words the same checks."""
    if dx_dtype not in FLOAT_DTYPES:
        raise TypeError(f"dx_dtype must be float32, float16, bfloat16 or float64, got {dx_dtype}")
    if not (grad_out.dtype == dx_dtype or (grad_out.dtype == torch.float32 and dx_dtype != torch.float64)):
        raise TypeError(f"grad_out must be the input's dtype or, for half input, torch.float32; got {grad_out.dtype}")
    if saved.dtype != (grad_out.dtype if memory_efficient else dx_dtype):
        raise TypeError(f"saved must be the {'output' if memory_efficient else 'input'}'s dtype; got {saved.dtype}")
    if grad_out.numel() != saved.numel() or grad_out.device != saved.device:
        raise ValueError(f"grad_out has {grad_out.numel()} elements on {grad_out.device}; expected "
                         f"{saved.numel()} on {saved.device}, as saved")
    rows = saved.numel() // hidden if hidden >= 1 else 0
    acc = torch.float64 if dx_dtype == torch.float64 else torch.float32
    for name, t in stats:
        if t.numel() != rows or t.dtype != acc or t.device != saved.device:
            raise ValueError(f"{name} must hold {rows} {acc} values (one per row) on {saved.device}, got "
                             f"{t.numel()} {t.dtype} on {t.device}")


def check_residual(input, residual):
    """fused_add_rms_norm's residual: input's shape, dtype and device."""
    if residual.shape != input.shape or residual.dtype != input.dtype or residual.device != input.device:
        raise ValueError(f"residual must match input: got {list(residual.shape)} {residual.dtype} on "
                         f"{residual.device}, input {list(input.shape)} {input.dtype} on {input.device}")


COMPACT_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)


def _check_like_params(params, ts, name):
    """``ts``: one tensor per param, of its shape and strides (state walks memory in
    the param's order), on its device, of one dtype; in the words of
    compact_state_args.h's check_like_params (its dtype is checked after)."""
    same_length(params, "params", ts, name)
    check_lists(("params", params), (name, ts), floating=False, doubles_apart=False)
    for i, (p, t) in enumerate(zip(params, ts)):
        if not same_layout(t, p):
            raise ValueError(f"{name}[{i}] must have the shape and strides of params[{i}] {list(p.stride())}, "
                             f"got {list(t.stride())}")


def _check_dtype_kind(ts, name, dtypes, dtype_words):
    if ts[0].dtype not in dtypes:
        raise TypeError(f"{name}: expected {dtype_words} tensors, got {ts[0].dtype}")


def _check_map_values(qmap, name):
    """compact_state_args.h's check_map_values: a map on the host is finite and ascending."""
    if qmap.device.type != "cpu" or isinstance(qmap, torch._subclasses.FakeTensor):
        return
    values = qmap.tolist()
    for j, v in enumerate(values):
        if not (math.isfinite(v) and (j == 0 or values[j - 1] <= v)):
            after = f" after {values[j - 1]:g}" if j else ""
            raise ValueError(f"{name} must hold finite values in ascending order; value {j} is {v:g}{after}")


def check_compact_adam(params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes,
                       master_params, steps, exp_avg_map, exp_avg_sq_map, lr_tensor=None, grad_scale=None,
                       found_inf=None):
    """The checks of fused_adam_compact_ (Note [Compact Adam state] in _schemas.py), for
    the reference and fake kernels; csrc/include/core_ops/compact_state_args.h words
    them for the C++ kernels. The lone tensors are the boundary's (_boundary.py) here."""
    from .reference.compact_state import blocks_of
    check_optimizer_lists(params, grads, steps)
    if not params:
        return
    if params[0].dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"params: compact Adam state is for float32, float16 or bfloat16 params, got "
                        f"{params[0].dtype}")
    check_dense_params(params)
    _check_like_params(params, exp_avgs, "exp_avgs")
    _check_like_params(params, exp_avg_sqs, "exp_avg_sqs")
    _check_dtype_kind(exp_avgs, "exp_avgs", COMPACT_STATE_DTYPES, "float32, bfloat16 or uint8")
    if exp_avg_sqs[0].dtype != exp_avgs[0].dtype:
        raise TypeError(f"exp_avg_sqs have dtype {exp_avg_sqs[0].dtype} but exp_avgs {exp_avgs[0].dtype}")
    quantized = exp_avgs[0].dtype == torch.uint8
    for name, absmaxes, qmap in (("exp_avg", exp_avg_absmaxes, exp_avg_map),
                                 ("exp_avg_sq", exp_avg_sq_absmaxes, exp_avg_sq_map)):
        if not quantized:
            if absmaxes:
                raise ValueError(f"{name}_absmaxes must be empty for float32 or bfloat16 moments")
            continue
        same_length(params, "params", absmaxes, f"{name}_absmaxes")
        for i, (p, a) in enumerate(zip(params, absmaxes)):
            if a.dtype != torch.float32 or a.device != p.device or a.shape != (blocks_of(p.numel()),) \
                    or not a.is_contiguous():
                raise ValueError(f"{name}_absmaxes[{i}] must be a contiguous float32 tensor of "
                                 f"{blocks_of(p.numel())} block maxima on {p.device}, got {a.dtype} "
                                 f"{list(a.shape)} on {a.device}")
        if (qmap is None or qmap.dtype != torch.float32 or qmap.shape != (256,) or qmap.device != params[0].device
                or not qmap.is_contiguous()):
            raise ValueError(f"{name}_map must be a contiguous float32 tensor of 256 values on "
                             f"{params[0].device} for uint8 moments")
        _check_map_values(qmap, f"{name}_map")
    if master_params:
        _check_like_params(params, master_params, "master_params")
        _check_dtype_kind(master_params, "master_params", (torch.float32, torch.int16), "float32 or int16")
        if master_params[0].dtype == torch.int16 and params[0].dtype != torch.bfloat16:
            raise TypeError(f"master_params: int16 remainders are for bfloat16 params, got {params[0].dtype} "
                            "params")
        if master_params[0].dtype == torch.float32 and params[0].dtype == torch.float32:
            raise TypeError("master_params: float32 params take no master_params")
