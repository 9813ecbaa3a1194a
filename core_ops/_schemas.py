"""Every op of core_ops, declared once: its schema and its fake (meta) kernel, and for
the norm forwards their autograd (Note [Norm autograd]).

Devices only add implementations: ``reference/`` registers a pure-PyTorch kernel for
every device (CompositeExplicitAutograd) and the native libraries built from ``csrc/``
register C++ kernels for CPU and CUDA with ``TORCH_LIBRARY_IMPL(core_ops, <key>, m)``.
A native kernel, once loaded, takes precedence over the reference for its device, so
dispatch is PyTorch's job and the ops work under ``torch.compile``.

Conventions shared by all multi-tensor ops (Note [Multi-tensor conventions]):
- every list holds tensors of one dtype on one device; lists may differ in dtype
  (an fp16 ``src`` may be scaled into an fp32 ``dst``);
- ``found_inf`` is a one-element float32 or int32 tensor on the same device; an op
  sets it to 1 when it sees inf or nan and never clears it (Apex's ``noop_flag``);
- arithmetic is done in float32 (float64 when a list is float64), norms are
  accumulated in float32 and returned as float32 (float64 for float64 inputs).
"""

import re

import torch

from ._boundary import checked, has_boundary
from ._op_checks import CHECKS, Call, OneOf, OptimizerLists, Requires, declare
from ._validate import (batch_norm_acc_dtype, check_arg_to_check, check_batch_norm_args, check_lists,
                        check_norm_args, check_norm_bwd_args, check_residual, check_update_scale_tensors,
                        loss_scale_args)

LIB_NAME = "core_ops"
_lib = torch.library.Library(LIB_NAME, "DEF")

SCHEMAS = {
    "multi_tensor_scale_": (
        "multi_tensor_scale_(Tensor[] src, Tensor(a!)[] dst, Tensor scale, "
        "Tensor(b!) found_inf) -> ()"
    ),
    # Read-only: found_inf := 1 when any element is inf or nan (the overflow check of a
    # loss scaler whose optimizer unscales inside its own kernel).
    "multi_tensor_check_finite_": (
        "multi_tensor_check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()"
    ),
    "multi_tensor_axpby_": (
        "multi_tensor_axpby_(Tensor[] x, Tensor[] y, Tensor(a!)[] out, float a, float b, "
        "Tensor(b!) found_inf, int arg_to_check) -> ()"
    ),
    "multi_tensor_l2norm": (
        "multi_tensor_l2norm(Tensor[] tensors, bool per_tensor) -> (Tensor, Tensor)"
    ),
    "multi_tensor_unscale_l2norm_": (
        "multi_tensor_unscale_l2norm_(Tensor(a!)[] tensors, Tensor inv_scale, "
        "Tensor(b!) found_inf, bool per_tensor) -> (Tensor, Tensor)"
    ),
    "update_scale_": (
        "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
        "Tensor(c!) hysteresis_tracker, Tensor found_inf, float growth_factor, "
        "float backoff_factor, int growth_interval, int hysteresis, float min_scale, "
        "float max_scale) -> ()"
    ),
    # Note [Fused optimizer ops]: one call updates one (device, dtype) group of params.
    # steps are per-tensor float32 counters (torch.optim's state["step"]) advanced by
    # the op; found_inf set means the op changes nothing, steps included; grads are
    # divided by grad_scale inside the op and written back so divided, as torch's fused
    # optimizers do (Note [Grads written back unscaled] in
    # csrc/include/core_ops/optimizer_args.h); lr_tensor, when given,
    # replaces lr (capturable / tensor lr, read on the device); master_params, when
    # not empty, are float32 copies the math updates, the params receiving their
    # rounding. State is float32 (float64 for float64 params).
    "fused_adam_": declare(
        "fused_adam_(Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, Tensor(e!)[] master_params, "
        "Tensor(f!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adam_w_mode, bool bias_correction, bool amsgrad, bool maximize, "
        "Tensor? lr_tensor, Tensor? grad_scale, Tensor? found_inf) -> ()",
        OptimizerLists(when=(("max_exp_avg_sqs", "amsgrad"),), master_grads=True),
    ),
    # Note [Compact Adam state]: fused_adam_ (no amsgrad) over params whose state is
    # kept small (core_ops/reference/compact_state.py). exp_avgs / exp_avg_sqs are all
    # float32, all bfloat16, or all uint8 codes of 8-bit blockwise moments, with
    # exp_avg_absmaxes / exp_avg_sq_absmaxes (float32, one per BLOCK elements in
    # memory order; empty lists otherwise) and the 256-value maps they index;
    # master_params is empty, float32 masters (half params), or int16 remainders
    # (bfloat16 params: master = param joined with remainder, Note [Master remainders]).
    "fused_adam_compact_": declare(
        "fused_adam_compact_(Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] exp_avg_absmaxes, Tensor(e!)[] exp_avg_sq_absmaxes, "
        "Tensor(f!)[] master_params, Tensor(h!)[] steps, Tensor? exp_avg_map, Tensor? exp_avg_sq_map, "
        "float lr, float beta1, float beta2, float eps, float weight_decay, bool adam_w_mode, "
        "bool bias_correction, bool maximize, Tensor? lr_tensor, Tensor? grad_scale, "
        "Tensor? found_inf) -> ()",
        Call("check_compact_adam", ("params", "grads", "exp_avgs", "exp_avg_sqs", "exp_avg_absmaxes",
                                    "exp_avg_sq_absmaxes", "master_params", "steps", "exp_avg_map",
                                    "exp_avg_sq_map", "lr_tensor", "grad_scale", "found_inf"),
             into=("CompactLayout", "layout")),
    ),
    "fused_sgd_": declare(
        "fused_sgd_(Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] momentum_buffers, "
        "Tensor(c!)[] master_params, float lr, float momentum, float dampening, "
        "float weight_decay, bool nesterov, bool wd_after_momentum, bool first_step, "
        "bool maximize, Tensor? lr_tensor, Tensor? grad_scale, Tensor? found_inf) -> ()",
        OptimizerLists(when=(("momentum_buffers", "momentum"),)),
        Requires("nesterov", "momentum", "nesterov needs momentum > 0"),
    ),
    "fused_adagrad_": declare(
        "fused_adagrad_(Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] state_sums, "
        "Tensor(c!)[] master_params, Tensor(d!)[] steps, float lr, float lr_decay, float eps, "
        "float weight_decay, bool adagrad_w_mode, bool maximize, Tensor? lr_tensor, "
        "Tensor? grad_scale, Tensor? found_inf) -> ()",
        OptimizerLists(),
    ),
    # LAMB runs in two stages around the per-tensor norms (csrc/include/core_ops/lamb_math.h):
    # stage 1 writes the moments and the raw update, stage 2 applies it with the trust
    # ratio from param_norms / update_norms (one norm per tensor).
    "fused_lamb_stage1_": declare(
        "fused_lamb_stage1_(Tensor[] params, Tensor(g!)[] grads, Tensor(a!)[] exp_avgs, "
        "Tensor(b!)[] exp_avg_sqs, Tensor[] master_params, Tensor(c!)[] steps, "
        "Tensor(d!)[] updates, float beta1, float beta2, float eps, float weight_decay, "
        "bool adam_w_mode, bool bias_correction, bool grad_averaging, bool maximize, "
        "Tensor? grad_scale, Tensor? found_inf) -> ()",
        OptimizerLists(),
    ),
    "fused_lamb_stage2_": declare(
        "fused_lamb_stage2_(Tensor(a!)[] params, Tensor(b!)[] master_params, Tensor[] updates, "
        "Tensor param_norms, Tensor update_norms, float lr, float weight_decay, bool use_nvlamb, "
        "Tensor? lr_tensor, Tensor? found_inf) -> ()",
        OptimizerLists(),
        Call("check_lamb_norms", ("params", "param_norms", "update_norms")),
    ),
    # NovoGrad's second moment is one scalar per tensor: exp_avg_sqs holds one-element
    # tensors and grad_norms the per-tensor norms of the grads as given (still scaled:
    # the op divides them by grad_scale), L2 (norm_type 2: v averages their squares) or
    # max|g| (norm_type 0: v averages the norms themselves), as in Apex
    # (csrc/include/core_ops/novograd_math.h).
    "fused_novograd_": declare(
        "fused_novograd_(Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] master_params, Tensor(e!)[] steps, "
        "Tensor grad_norms, int norm_type, float lr, float beta1, float beta2, float eps, "
        "float weight_decay, bool bias_correction, bool reg_inside_moment, bool grad_averaging, "
        "bool init_zero, bool maximize, Tensor? lr_tensor, Tensor? grad_scale, "
        "Tensor? found_inf) -> ()",
        OneOf("norm_type", (2, 0), "norm_type must be 2 (L2) or 0 (infinity norm), got {norm_type}"),
        OptimizerLists(apart=("exp_avg_sqs",)),
        Call("check_per_tensor_state", ("params", "exp_avg_sqs", "grad_norms")),
    ),
    # Note [Sync batch norm ops]: the per-rank pieces of a batch norm whose statistics
    # are merged across ranks (core_ops/parallel/sync_batchnorm_function.py does the
    # communication). input is (N, C, *), N may be 0; any strides (channels-last
    # memory is read in place); outputs have input's dtype and strides. Per-channel
    # tensors (mean, var, invstd, sums) are (C,) float32, float64 for float64 input.
    # stats: mean and biased variance by Welford (csrc/include/core_ops/welford_math.h),
    # zeros for an empty batch. elemt: y = (x - mean) * invstd * weight + bias.
    # backward_reduce: sum(dy) and sum(dy * (x - mean)) per channel. backward_elemt:
    # dx = (dy - mean_dy - (x - mean) * invstd^2 * mean_dy_xmu) * invstd * weight, with
    # mean_dy / mean_dy_xmu the global sums divided by the global count.
    "sync_batch_norm_stats": "sync_batch_norm_stats(Tensor input) -> (Tensor, Tensor)",
    "sync_batch_norm_elemt": (
        "sync_batch_norm_elemt(Tensor input, Tensor mean, Tensor invstd, Tensor? weight, "
        "Tensor? bias) -> Tensor"
    ),
    "sync_batch_norm_backward_reduce": (
        "sync_batch_norm_backward_reduce(Tensor grad_out, Tensor input, Tensor mean) "
        "-> (Tensor, Tensor)"
    ),
    "sync_batch_norm_backward_elemt": (
        "sync_batch_norm_backward_elemt(Tensor grad_out, Tensor input, Tensor mean, "
        "Tensor invstd, Tensor? weight, Tensor mean_dy, Tensor mean_dy_xmu) -> Tensor"
    ),
    # Note [Norm ops]: layer norm and RMS norm over rows of the last `hidden` values of
    # input (any shape; a non-contiguous input is read through a contiguous copy). The
    # statistics are float32 (float64 for float64 input), one per row: mean and
    # rstd = 1 / sqrt(var + eps), RMS norm's rstd = 1 / sqrt(mean(x^2) + eps). out has
    # input's shape, contiguous, in out_dtype (default input's; float32 for half input
    # is Apex's "mixed" form). weight / bias hold `hidden` values in any floating dtype.
    # Backward takes the forward's input as `saved`, or its output when
    # memory_efficient (xhat recovered by inverting the affine map, as Apex does; the
    # forward's flag only tells its registered autograd which of the two to keep);
    # grad_out has out's dtype, dx is dx_dtype (the input's); dweight / dbias come in
    # weight / bias's dtype and shape, empty (0,) tensors when there is none. The math
    # is csrc/include/core_ops/norm_math.h.
    "layer_norm_fwd": (
        "layer_norm_fwd(Tensor input, Tensor? weight, Tensor? bias, int hidden, float eps, "
        "ScalarType? out_dtype, bool memory_efficient=False) -> (Tensor, Tensor, Tensor)"
    ),
    "layer_norm_bwd": (
        "layer_norm_bwd(Tensor grad_out, Tensor saved, Tensor mean, Tensor rstd, Tensor? weight, "
        "Tensor? bias, int hidden, bool memory_efficient, ScalarType dx_dtype) -> (Tensor, Tensor, Tensor)"
    ),
    "rms_norm_fwd": (
        "rms_norm_fwd(Tensor input, Tensor? weight, int hidden, float eps, ScalarType? out_dtype, "
        "bool memory_efficient=False) -> (Tensor, Tensor)"
    ),
    "rms_norm_bwd": (
        "rms_norm_bwd(Tensor grad_out, Tensor saved, Tensor rstd, Tensor? weight, int hidden, "
        "bool memory_efficient, ScalarType dx_dtype) -> (Tensor, Tensor)"
    ),
    # The pre-norm residual step in one pass over its inputs: h = input + residual
    # (rounded to their dtype), y = rms_norm(h) * weight; returns (y, h, rstd). Its
    # backward is rms_norm_bwd plus h's own grad.
    "fused_add_rms_norm_fwd": (
        "fused_add_rms_norm_fwd(Tensor input, Tensor residual, Tensor? weight, int hidden, float eps, "
        "bool memory_efficient=False) -> (Tensor, Tensor, Tensor)"
    ),
}

for _schema in SCHEMAS.values():
    _lib.define(_schema)

OP_NAMES = tuple(SCHEMAS)

# Not an op of the package: what a loaded CPU library says of itself, the x86-64 level
# it registered and why (Note [CPU levels] in csrc/cpu/level.h); native.cpu_level()
# calls it. The tensor only routes the call to the CPU library.
_lib.define("native_cpu_level(Tensor probe) -> str")


def _fake(name):
    """Registers the decorated function as op ``name``'s fake (meta) kernel, behind the
    checks every call of an op with lists meets (Note [Op boundary] in _boundary.py)."""
    def register(fn):
        torch.library.register_fake(f"core_ops::{name}")(checked(name, fn) if has_boundary(name) else fn)
        return fn
    return register


def norm_dtype(tensors):
    """The dtype l2norm accumulates and returns in: float64 for float64 lists, else float32."""
    if tensors and tensors[0].dtype == torch.float64:
        return torch.float64
    return torch.float32


def _norm_outputs(tensors, per_tensor):
    dtype = norm_dtype(tensors)
    device = tensors[0].device if tensors else torch.device("cpu")
    total = torch.empty((), dtype=dtype, device=device)
    per = torch.empty((len(tensors) if per_tensor else 0,), dtype=dtype, device=device)
    return total, per


@_fake("multi_tensor_scale_")
def _(src, dst, scale, found_inf):
    check_lists(("src", src), ("dst", dst))


@_fake("multi_tensor_check_finite_")
def _(tensors, found_inf):
    check_lists(("tensors", tensors))


@_fake("multi_tensor_axpby_")
def _(x, y, out, a, b, found_inf, arg_to_check):
    check_arg_to_check(arg_to_check)
    check_lists(("x", x), ("y", y), ("out", out))


@_fake("multi_tensor_l2norm")
def _(tensors, per_tensor):
    check_lists(("tensors", tensors))
    return _norm_outputs(tensors, per_tensor)


@_fake("multi_tensor_unscale_l2norm_")
def _(tensors, inv_scale, found_inf, per_tensor):
    check_lists(("tensors", tensors))
    return _norm_outputs(tensors, per_tensor)


@_fake("update_scale_")
def _(scale, growth_tracker, hysteresis_tracker, found_inf, growth_factor, backoff_factor,
      growth_interval, hysteresis, min_scale, max_scale):
    check_update_scale_tensors(scale, growth_tracker, hysteresis_tracker, found_inf)
    loss_scale_args(growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale)


# A declared op that returns nothing (every optimizer op) has its declared checks as its
# fake kernel (Note [Declared checks], run by ``checked``): nothing to write for it here.
for _name, _schema in SCHEMAS.items():
    if _name in CHECKS and _schema.endswith("-> ()"):
        _fake(_name)(lambda *args, **kwargs: None)


def _per_channel(input):
    return input.new_empty((input.shape[1],), dtype=batch_norm_acc_dtype(input.dtype))


@_fake("sync_batch_norm_stats")
def _(input):
    check_batch_norm_args(input)
    return _per_channel(input), _per_channel(input)


@_fake("sync_batch_norm_elemt")
def _(input, mean, invstd, weight, bias):
    check_batch_norm_args(input, stats=(("mean", mean), ("invstd", invstd)), weight=weight, bias=bias)
    return torch.empty_like(input)


@_fake("sync_batch_norm_backward_reduce")
def _(grad_out, input, mean):
    check_batch_norm_args(input, grad_out=grad_out, stats=(("mean", mean),))
    return _per_channel(input), _per_channel(input)


@_fake("sync_batch_norm_backward_elemt")
def _(grad_out, input, mean, invstd, weight, mean_dy, mean_dy_xmu):
    check_batch_norm_args(input, grad_out=grad_out, weight=weight, stats=(
        ("mean", mean), ("invstd", invstd), ("mean_dy", mean_dy), ("mean_dy_xmu", mean_dy_xmu)))
    return torch.empty_like(input)


def _rows_of(t, hidden):
    return t.numel() // hidden if t.numel() else 0


def _norm_fwd_outputs(input, hidden, out_dtype):
    stats = batch_norm_acc_dtype(input.dtype)
    rows = _rows_of(input, hidden)
    return (input.new_empty(input.shape, dtype=out_dtype or input.dtype),
            input.new_empty((rows,), dtype=stats), input.new_empty((rows,), dtype=stats))


def _param_grad(p, like):
    return like.new_empty((0,)) if p is None else torch.empty_like(p, memory_format=torch.contiguous_format)


@_fake("layer_norm_fwd")
def _(input, weight, bias, hidden, eps, out_dtype, memory_efficient=False):
    check_norm_args(input, hidden, (("weight", weight), ("bias", bias)), out_dtype)
    return _norm_fwd_outputs(input, hidden, out_dtype)


@_fake("rms_norm_fwd")
def _(input, weight, hidden, eps, out_dtype, memory_efficient=False):
    check_norm_args(input, hidden, (("weight", weight),), out_dtype)
    out, _, rstd = _norm_fwd_outputs(input, hidden, out_dtype)
    return out, rstd


@_fake("layer_norm_bwd")
def _(grad_out, saved, mean, rstd, weight, bias, hidden, memory_efficient, dx_dtype):
    check_norm_args(saved, hidden, (("weight", weight), ("bias", bias)), name="saved")
    check_norm_bwd_args(grad_out, saved, (("mean", mean), ("rstd", rstd)), hidden, dx_dtype, memory_efficient)
    return (saved.new_empty(saved.shape, dtype=dx_dtype), _param_grad(weight, saved), _param_grad(bias, saved))


@_fake("rms_norm_bwd")
def _(grad_out, saved, rstd, weight, hidden, memory_efficient, dx_dtype):
    check_norm_args(saved, hidden, (("weight", weight),), name="saved")
    check_norm_bwd_args(grad_out, saved, (("rstd", rstd),), hidden, dx_dtype, memory_efficient)
    return saved.new_empty(saved.shape, dtype=dx_dtype), _param_grad(weight, saved)


@_fake("fused_add_rms_norm_fwd")
def _(input, residual, weight, hidden, eps, memory_efficient=False):
    check_norm_args(input, hidden, (("weight", weight),))
    check_residual(input, residual)
    out, _, rstd = _norm_fwd_outputs(input, hidden, None)
    return out, torch.empty_like(out), rstd


# Note [Norm autograd]: the forwards' autograd, registered here with their schemas so it
# is the one autograd of every device and kernel (the Autograd alias key, over whichever
# kernel dispatch picks below it; the native libraries register none, the stable ABI
# has no C++ autograd). Backward is the backward op over what the forward kept: its
# input, or its output when memory_efficient. The statistics are not differentiable,
# and grads are not materialized: an output left unused sends None, not zeros, so a
# norm whose output went unused does no work and fused_add_rms_norm's weight gets no
# grad when only h was used.
def _keep_norm_config(ctx, input, hidden, memory_efficient, stats):
    ctx.hidden, ctx.memory_efficient, ctx.dx_dtype = hidden, memory_efficient, input.dtype
    ctx.mark_non_differentiable(*stats)
    ctx.set_materialize_grads(False)


def _if_given(param, grad):
    return None if param is None else grad  # the op's (0,) placeholder is not a grad


def _layer_norm_setup(ctx, inputs, output):
    input, weight, bias, hidden, _eps, _out_dtype, memory_efficient = inputs
    out, mean, rstd = output
    _keep_norm_config(ctx, input, hidden, memory_efficient, (mean, rstd))
    ctx.save_for_backward(out if memory_efficient else input, mean, rstd, weight, bias)


def _layer_norm_backward(ctx, grad_out, _grad_mean, _grad_rstd):
    if grad_out is None:
        return (None,) * 7
    saved, mean, rstd, weight, bias = ctx.saved_tensors
    dx, dw, db = op("layer_norm_bwd")(grad_out, saved, mean, rstd, weight, bias, ctx.hidden,
                                      ctx.memory_efficient, ctx.dx_dtype)
    return dx, _if_given(weight, dw), _if_given(bias, db), None, None, None, None


def _rms_norm_setup(ctx, inputs, output):
    input, weight, hidden, _eps, _out_dtype, memory_efficient = inputs
    out, rstd = output
    _keep_norm_config(ctx, input, hidden, memory_efficient, (rstd,))
    ctx.save_for_backward(out if memory_efficient else input, rstd, weight)


def _rms_norm_backward(ctx, grad_out, _grad_rstd):
    if grad_out is None:
        return (None,) * 6
    saved, rstd, weight = ctx.saved_tensors
    dx, dw = op("rms_norm_bwd")(grad_out, saved, rstd, weight, ctx.hidden, ctx.memory_efficient, ctx.dx_dtype)
    return dx, _if_given(weight, dw), None, None, None, None


def _fused_add_rms_norm_setup(ctx, inputs, output):
    input, _residual, weight, hidden, _eps, memory_efficient = inputs
    y, h, rstd = output
    _keep_norm_config(ctx, input, hidden, memory_efficient, (rstd,))
    ctx.save_for_backward(y if memory_efficient else h, rstd, weight)


# h = input + residual feeds y's norm and is an output too: its grad is the norm's input
# grad plus h's own, and it reaches input and residual alike.
def _fused_add_rms_norm_backward(ctx, grad_y, grad_h, _grad_rstd):
    dh = dw = None
    if grad_y is not None:
        saved, rstd, weight = ctx.saved_tensors
        dh, dw = op("rms_norm_bwd")(grad_y, saved, rstd, weight, ctx.hidden, ctx.memory_efficient, ctx.dx_dtype)
        dw = _if_given(weight, dw)
    if grad_h is not None:
        dh = grad_h if dh is None else dh + grad_h
    return dh, dh, dw, None, None, None


torch.library.register_autograd("core_ops::layer_norm_fwd", _layer_norm_backward, setup_context=_layer_norm_setup)
torch.library.register_autograd("core_ops::rms_norm_fwd", _rms_norm_backward, setup_context=_rms_norm_setup)
torch.library.register_autograd("core_ops::fused_add_rms_norm_fwd", _fused_add_rms_norm_backward,
                                setup_context=_fused_add_rms_norm_setup)


def op(name):
    """``core_ops::<name>``: its OpOverload while torch.compile traces, else the same
    op raising a native kernel's refusals as the reference's (Note [Typed errors])."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.core_ops, name).default
    typed = _typed_ops.get(name)
    if typed is None:  # made once per op: a norm forward on a small input takes 10 us
        typed = _typed_ops.setdefault(name, _TypedErrors(getattr(torch.ops.core_ops, name).default))
    return typed


_typed_ops = {}


# Note [Typed errors] (csrc/include/core_ops/tensor.h): a native kernel's "[TypeError] ..."
# or "[ValueError] ..." arrives as a RuntimeError (the stable ABI carries messages; the
# classes torch gives C++ exceptions differ between releases); it is raised again as
# that class, with the message alone.
_TAGGED = re.compile(r"\[(TypeError|ValueError)\] ([^\n]*)")
_CLASSES = {"TypeError": TypeError, "ValueError": ValueError}


def _call_typed(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        tagged = _TAGGED.search(str(e))
        if tagged is None:
            raise
        raise _CLASSES[tagged.group(1)](tagged.group(2)) from None


class _TypedErrors:
    __slots__ = ("overload",)

    def __init__(self, overload):
        self.overload = overload

    def __call__(self, *args, **kwargs):
        return _call_typed(self.overload, *args, **kwargs)

    def redispatch(self, *args, **kwargs):
        return _call_typed(self.overload.redispatch, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.overload, name)
