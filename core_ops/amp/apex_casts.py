"""Apex's O1 cast lists as a ``TorchFunctionMode``, for ``amp.init()`` (Apex's API from
before ``initialize``; legacy_init.py). Apex patched torch's functions so that, while
its handle was active, each listed function cast its floating-point tensor arguments:

  FP16       to half: convolutions, linear, the matmul family, RNNs and RNN cells;
  FP32       to float32: softmax and friends, the norms, the losses, exp / log / pow,
             reductions (sum, prod, cumsum, norm, std, var, ...);
  promote    to the widest floating dtype among them: elementwise binary ops,
             comparisons, addcmul / addcdiv, atan2, dot, cat / stack;
  banned     F.binary_cross_entropy: an error (its input is usually a half sigmoid,
             which loses the precision BCE needs) unless ``allow_banned``, then float32.

An in-place FP32 function (``exp_``) on a half tensor or FP16 function on a float one
raises, as in Apex: its result could not be stored in the tensor's dtype. In-place
promote ops (``add_``) keep the tensor's dtype. As in Apex, ``Tensor.cpu()`` returns
float32. Unlike Apex, casts are not cached (each call casts its weights again; Apex
cached them per iteration).

The mode only casts; ``amp.init()`` also enters ``torch.autocast`` (without its weight
cache, which would go stale across optimizer steps), so that code under it sees
autocast on (RNN modules accept half inputs to float32 weights, the registered
``amp.half_function`` s cast) and ops outside Apex's lists get autocast's casts: see
``legacy_init.AUTOCAST_DIFFERENCES``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .model_casting import cast_tree, floating_tensors

_FP16 = {
    F: ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
        "linear"],
    torch: ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
            "prelu", "addmm", "addmv", "addr", "matmul", "mm", "mv", "bmm", "baddbmm", "addbmm",
            "rnn_tanh", "rnn_relu", "lstm", "gru", "rnn_tanh_cell", "rnn_relu_cell", "lstm_cell", "gru_cell"],
}
_FP32 = {
    F: ["interpolate", "grid_sample", "softplus", "softmin", "log_softmax", "softmax", "gelu", "layer_norm",
        "group_norm", "local_response_norm", "normalize", "cosine_similarity", "poisson_nll_loss",
        "cosine_embedding_loss", "cross_entropy", "hinge_embedding_loss", "kl_div", "l1_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss", "multi_margin_loss",
        "nll_loss", "binary_cross_entropy_with_logits", "smooth_l1_loss", "soft_margin_loss",
        "triplet_margin_loss", "ctc_loss"],
    torch: ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "reciprocal", "rsqrt",
            "sinh", "tan", "pow", "cumprod", "cumsum", "dist", "norm", "prod", "std", "sum", "var", "renorm"],
}
_PROMOTE = {
    torch: ["addcdiv", "addcmul", "atan2", "cross", "bilinear", "dot", "add", "div", "mul", "sub", "true_divide",
            "eq", "equal", "ge", "gt", "le", "lt", "ne"],
}
_SEQUENCE = ["cat", "stack"]
_TENSOR_ONLY = {"FP16": ["__matmul__", "__rmatmul__"], "FP32": ["__pow__", "__rpow__", "cpu"],
                "PROMOTE": ["__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
                            "__rtruediv__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"]}
BANNED = {
    F.binary_cross_entropy: (
        "amp.init() does not run F.binary_cross_entropy / nn.BCELoss: its input is usually the "
        "half output of a sigmoid, too coarse for the loss. Use nn.BCEWithLogitsLoss (sigmoid and "
        "loss in one, float32 under amp), or amp.register_float_function(torch, 'sigmoid') before "
        "amp.init(), or pass allow_banned=True to amp.init() to run it in float32."),
}


def _functions(modules, kind):
    """{function object: kind} for the names that exist here, as torch functions and as
    Tensor methods (with their in-place forms, marked)."""
    rules = {}
    for module, names in modules.items():
        for name in names:
            if hasattr(module, name):
                rules[getattr(module, name)] = (kind, False)
            if hasattr(torch.Tensor, name):
                rules[getattr(torch.Tensor, name)] = (kind, False)
            if hasattr(torch.Tensor, name + "_"):
                rules[getattr(torch.Tensor, name + "_")] = (kind, True)
    return rules


def _rules():
    rules = {}
    rules.update(_functions(_PROMOTE, "promote"))
    rules.update(_functions(_FP32, "fp32"))
    rules.update(_functions(_FP16, "fp16"))
    for name in _SEQUENCE:
        rules[getattr(torch, name)] = ("promote", False)
    for kind, names in (("fp16", _TENSOR_ONLY["FP16"]), ("fp32", _TENSOR_ONLY["FP32"]),
                        ("promote", _TENSOR_ONLY["PROMOTE"])):
        for name in names:
            rules[getattr(torch.Tensor, name)] = (kind, False)
    for name in ("__ipow__",):
        rules[torch.Tensor.__ipow__] = ("fp32", True)
    for fn in BANNED:
        rules[fn] = ("banned", False)
    return rules


RULES = _rules()


def _widest(args, kwargs):
    widest = None
    for t in floating_tensors((args, kwargs)):
        widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
    return widest


def _autocast_off(args, kwargs):
    """A block with autocast off for the device types of the floating-point arguments."""
    stack = contextlib.ExitStack()
    for device_type in sorted({t.device.type for t in floating_tensors((args, kwargs))}):
        stack.enter_context(torch.autocast(device_type, enabled=False))
    return stack


class ApexCasts(TorchFunctionMode):
    """Casts the arguments of Apex's listed functions (module doc). ``paused`` lets
    them through untouched (the handle's ``_disable_casts``)."""

    def __init__(self, half_dtype=torch.float16, allow_banned=False):
        super().__init__()
        self.half_dtype = half_dtype
        self.allow_banned = allow_banned
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = None if self.paused else RULES.get(func)
        if rule is None:
            return func(*args, **kwargs)
        kind, in_place = rule
        if in_place and kind == "promote":
            return func(*args, **kwargs)  # add_ and friends keep the tensor's dtype
        if kind == "banned":
            if not self.allow_banned:
                raise NotImplementedError(BANNED[func])
            # Allowed, it runs in float32 as in Apex, and outside autocast: CUDA's
            # autocast refuses binary_cross_entropy whatever its input dtype.
            with _autocast_off(args, kwargs):
                return func(*cast_tree(args, torch.float32), **cast_tree(kwargs, torch.float32))
        if kind == "promote":
            dtype = _widest(args, kwargs)
        else:
            dtype = self.half_dtype if kind == "fp16" else torch.float32
        if dtype is None:
            return func(*args, **kwargs)
        if in_place:
            target = args[0]
            if isinstance(target, torch.Tensor) and target.is_floating_point() and target.dtype != dtype:
                raise NotImplementedError(
                    f"amp.init(): {getattr(func, '__name__', func)} runs in {dtype} under amp's casts, so it "
                    f"cannot write its result into a {target.dtype} tensor in place; use the out-of-place form")
            return func(args[0], *cast_tree(args[1:], dtype), **cast_tree(kwargs, dtype))
        return func(*cast_tree(args, dtype), **cast_tree(kwargs, dtype))
