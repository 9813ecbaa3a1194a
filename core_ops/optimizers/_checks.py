"""The argument checks of the fused optimizers: hyperparameters (of the constructor and
of every param group, as added), params, and the step's grad_scale / found_inf.

Note [Checks before updates]: everything that can be rejected is rejected before the
first change, so an error never leaves a half-applied step, a half-added group or a
half-loaded state dict behind. Values are checked once, when they arrive (a tensor lr
is read on the host there); the step itself never syncs to check them.
"""

import difflib
import numbers
import warnings

import torch
from torch.optim.optimizer import required

from .._validate import dense

# Hyperparameters that must be >= 0 wherever an optimizer takes them. "step" is
# FusedMixedPrecisionLamb's starting step count (Apex's per-group count).
NON_NEGATIVE = ("lr", "eps", "weight_decay", "momentum", "dampening", "lr_decay",
                "initial_accumulator_value", "max_grad_norm", "step")

# Keys that torch puts into param groups besides an optimizer's defaults: the LR
# schedulers' initial_lr, and the names of params given as (name, param) pairs.
TORCH_GROUP_KEYS = ("params", "initial_lr", "param_names")


def check_hyperparameters(values, where=""):
    """Each known hyperparameter in the dict ``values``; ``where`` prefixes the name in
    the error ("param group 1: lr must be >= 0, got -1.0"). torch.optim's ``required``
    (Apex's ``FusedSGD(params, lr=required)``) passes here: each group must then give
    the value (``check_given``)."""
    if "lr" in values and values["lr"] is None:  # the others may be None (max_grad_norm: no clipping)
        raise TypeError(f"{where}lr must be a number or a one-element tensor, got None")
    for key in NON_NEGATIVE:
        if values.get(key) is not None and not isinstance(values[key], type(required)):
            _check_non_negative(values[key], where + key)
    if "betas" in values:
        _check_betas(values["betas"], where + "betas")


def check_given(group, where):
    """A param group (merged over the defaults) holds no ``required`` left unset."""
    for key, value in group.items():
        if isinstance(value, type(required)):  # (a pickled one is a new instance)
            raise ValueError(f"{where}parameter group didn't specify a value of required "
                             f"optimization parameter {key}: give {key}= to the constructor or "
                             f"in every param group")


def check_group_keys(group, allowed, where, owner):
    """Param groups may carry keys of their own, as in torch.optim: a name for logging
    (Lightning's LearningRateMonitor), a layer-wise lr scale (timm), keys an LR
    scheduler or a torch optimizer put there. A key that is one typo away from an
    option of this optimizer ('weight_decy') is most likely meant as that option,
    which would otherwise stay at its default: that one is warned about."""
    known = set(allowed) | set(TORCH_GROUP_KEYS)
    for key in sorted(set(group) - known):
        close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.85)
        if close:
            warnings.warn(f"{where}option '{key}' is not one of {owner}'s; did you mean '{close[0]}'? "
                          f"It is kept in the group but not used", stacklevel=4)


def check_dense(params, where):
    """The fused kernels walk each tensor as one flat range, so a param must be dense
    (contiguous, or a permutation of it, e.g. transposed); a strided view with gaps
    (``w[:, ::2]``) is rejected here rather than at the first step."""
    for i, p in enumerate(params):
        if isinstance(p, torch.Tensor) and p.layout == torch.strided and not dense(p):
            raise ValueError(f"{where}params[{i}] must be dense (contiguous or a permutation of it), got "
                             f"shape {list(p.shape)} with strides {list(p.stride())}; pass a contiguous "
                             "tensor (e.g. a Parameter of its own)")


def check_scale_args(grad_scale, found_inf):
    """step()'s grad_scale / found_inf are tensors (they stay on the device: no sync)."""
    for name, value in (("grad_scale", grad_scale), ("found_inf", found_inf)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"step(): {name} must be a one-element tensor (on any device) or None, "
                            f"got {type(value).__name__} {value!r}")
        if isinstance(value, torch.Tensor) and value.device.type == "meta":
            raise ValueError(f"step(): {name} is a meta tensor, which holds no value: give a tensor on a "
                             "device (any: it is moved to each param's)")


def _number(value, name):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor, got a tensor of shape "
                             f"{list(value.shape)}")
        if value.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor, which holds no value: give a number or a tensor on "
                             "the params' device")
        return value.item()
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return value


def _check_non_negative(value, name):
    number = _number(value, name)
    if not number >= 0:  # also NaN
        raise ValueError(f"{name} must be >= 0, got {number}")


def _check_betas(betas, name):
    if isinstance(betas, torch.Tensor) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise ValueError(f"{name} must be a pair (beta1, beta2), got {betas!r}")
    for beta in betas:
        number = _number(beta, name)
        if not 0.0 <= number < 1.0:  # also NaN
            raise ValueError(f"{name} must be in [0, 1), got {tuple(betas)}")
