"""Apex's ``FP16_Optimizer``: wraps an optimizer (torch's or core_ops') whose params
are half (fp16 or bf16) or float32, so that it steps float32 masters of the half ones
and copies them back, with a static or dynamic loss scale.

    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               dynamic_loss_scale=True)
    optimizer.backward(loss)          # scaled backward, then unscaled master grads
    optimizer.clip_master_grads(1.0)  # optional
    optimizer.step()                  # skipped (returns None) if the grads overflowed

The master-grad path is one multi-tensor pass per (device, dtype) that unscales the
model's grads into the masters' and flags an inf or nan, and the scale lives on the
device in core_ops' ``LossScaler``. One host sync per ``backward``: ``overflow`` must be
known on the host, as in Apex. Unlike Apex, a static scale also skips an overflowed step
(Apex stepped into the inf grads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ....amp.loss_scaler import LossScaler as _DeviceScaler
from ....multi_tensor_apply import multi_tensor_scale
from ....settings import INIT_LOSS_SCALE, MAX_LOSS_SCALE
from .fp16util import clip_grad_norm, zero_grads
from .._wrapper import ForwardsToOptimizer

_HALF = (torch.float16, torch.bfloat16)
# Apex's dynamic_loss_args (its amp LossScaler's) and core_ops' LossScaler's names.
_DYNAMIC_ARGS = {"init_scale": "init_scale", "scale_window": "growth_interval",
                 "min_loss_scale": "min_scale", "max_loss_scale": "max_scale", "scale_factor": None}
# A closure that keeps overflowing halves the scale each time: past this many retries
# the loss itself is not finite, and looping further would hang.
_CLOSURE_RETRIES = 64


def _device_scaler(static_loss_scale, dynamic_loss_scale, dynamic_loss_args):
    if not dynamic_loss_scale:
        if not (static_loss_scale > 0 and math.isfinite(static_loss_scale)):
            raise ValueError(f"static_loss_scale must be a finite number > 0, got {static_loss_scale}")
        return _DeviceScaler(init_scale=static_loss_scale, dynamic=False)
    args = dict(dynamic_loss_args or {})
    unknown = sorted(set(args) - set(_DYNAMIC_ARGS))
    if unknown:
        raise TypeError(f"dynamic_loss_args: unknown keys {unknown}; expected some of {sorted(_DYNAMIC_ARGS)}")
    factor = float(args.pop("scale_factor", 2.0))
    options = dict(init_scale=INIT_LOSS_SCALE, growth_interval=2000, max_scale=MAX_LOSS_SCALE)  # Apex's amp defaults
    options.update({_DYNAMIC_ARGS[k]: v for k, v in args.items()})
    if options.get("min_scale") is None:
        options["min_scale"] = 0.0
    return _DeviceScaler(growth_factor=factor, backoff_factor=1.0 / factor, dynamic=True, **options)


class FP16_Optimizer(ForwardsToOptimizer):
    """``init_optimizer`` stepping float32 masters of its half params (see the module
    doc). Attributes as Apex's: ``optimizer``, ``fp16_groups``, ``fp32_from_fp16_groups``,
    ``fp32_from_fp32_groups``, ``overflow``, ``loss_scale``, ``param_groups``, ``state``."""

    def __init__(self, init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False,
                 dynamic_loss_args=None, verbose=True):
        if not hasattr(init_optimizer, "param_groups"):
            raise TypeError(f"init_optimizer must be a torch.optim.Optimizer, got {type(init_optimizer).__name__}")
        self.verbose = verbose
        self.optimizer = init_optimizer
        self.fp16_groups, self.fp32_from_fp16_groups, self.fp32_from_fp32_groups = [], [], []
        for g, group in enumerate(init_optimizer.param_groups):
            halves, masters, floats = [], [], []
            for i, param in enumerate(group["params"]):
                if not param.requires_grad:
                    continue
                if param.dtype in _HALF:
                    master = param.detach().clone().float().requires_grad_()
                    group["params"][i] = master
                    if param in init_optimizer.state:  # state made before wrapping follows the master
                        init_optimizer.state[master] = init_optimizer.state.pop(param)
                    halves.append(param)
                    masters.append(master)
                elif param.dtype == torch.float32:
                    floats.append(param)
                else:
                    raise TypeError(f"FP16_Optimizer: param {i} of param group {g} is {param.dtype}; "
                                    f"expected float16, bfloat16 or float32")
            self.maybe_print(f"FP16_Optimizer: param group {g}: {len(halves)} half params "
                             f"(float32 masters made), {len(floats)} float32 params")
            self.fp16_groups.append(halves)
            self.fp32_from_fp16_groups.append(masters)
            self.fp32_from_fp32_groups.append(floats)
        self.all_fp16_params = [p for g in self.fp16_groups for p in g]
        self.all_fp32_from_fp16_params = [p for g in self.fp32_from_fp16_groups for p in g]
        self.all_fp32_from_fp32_params = [p for g in self.fp32_from_fp32_groups for p in g]
        # A round trip through the state dict casts state made before wrapping (momentum
        # of a half param) to its master's float32.
        init_optimizer.load_state_dict(init_optimizer.state_dict())
        self.dynamic_loss_scale = bool(dynamic_loss_scale)
        self.loss_scaler = _device_scaler(static_loss_scale, dynamic_loss_scale, dynamic_loss_args)
        self.overflow = False
        self.first_closure_call_this_step = True
        self.clip_grad_norm = clip_grad_norm

    def maybe_print(self, msg):
        if self.verbose:
            print(msg)

    def __getstate__(self):
        raise RuntimeError("FP16_Optimizer should be serialized using state_dict().")

    def __setstate__(self, state):
        raise RuntimeError("FP16_Optimizer should be deserialized using load_state_dict().")

    # ---- the loss scale ---------------------------------------------------------------

    @property
    def loss_scale(self):
        return self.loss_scaler.get_scale()

    @loss_scale.setter
    def loss_scale(self, value):
        self.loss_scaler._loss_scale = value

    def _scale_on(self, device):
        return self.loss_scaler.scale_tensor(device)

    # ---- backward and the master grads ------------------------------------------------

    def backward(self, loss, update_master_grads=True, retain_graph=False):
        """Backward on ``loss.float() * loss_scale``; then, unless ``update_master_grads``
        is False (several losses per step: call ``update_master_grads()`` after the
        last), the unscaled grads into the masters."""
        (loss.float() * self._scale_on(loss.device)).backward(retain_graph=retain_graph)
        if update_master_grads:
            self.update_master_grads()

    def update_master_grads(self):
        """Unscales the model's grads into the masters' (half params) or in place
        (float32 params), sets ``overflow`` and updates the loss scale."""
        pairs = []  # (model grad, master grad) with the master grads allocated
        for half, master in zip(self.all_fp16_params, self.all_fp32_from_fp16_params):
            if half.grad is None:
                master.grad = None
                continue
            if master.grad is None:
                master.grad = torch.empty_like(master)
            pairs.append((half.grad, master.grad))
        pairs += [(p.grad, p.grad) for p in self.all_fp32_from_fp32_params if p.grad is not None]
        groups = {}
        for src, dst in pairs:
            groups.setdefault((src.device, src.dtype), []).append((src, dst))
        found = None
        for (device, _), group in groups.items():
            inv = torch.reciprocal(self._scale_on(device).double()).float()
            flag = multi_tensor_scale([s for s, _ in group], [d for _, d in group], inv).reshape(())
            found = flag if found is None else torch.maximum(found, flag.to(found.device))
        if found is None:
            self.overflow = False
            return
        self.loss_scaler.update_from(found)
        self.overflow = bool(found.item())

    def inspect_master_grad_data(self):
        """The masters' grads, one list per param group (None where a param has no
        grad); None, with a warning, after an overflow."""
        if self.overflow:
            print("Warning: FP16_Optimizer.inspect_master_grad_data after an overflow: the grads "
                  "are not valid. Returning None.")
            return None
        return [[None if p.grad is None else p.grad.detach() for p in g["params"]]
                for g in self.optimizer.param_groups]

    def clip_master_grads(self, max_norm, norm_type=2):
        """Clips the master grads by their global norm (one multi-tensor pass for L2);
        returns the norm before clipping, or -1 after an overflow."""
        if self.overflow:
            return -1
        return self.clip_grad_norm([p for g in self.optimizer.param_groups for p in g["params"]],
                                   max_norm, norm_type)

    # ---- stepping ---------------------------------------------------------------------

    def zero_grad(self, set_grads_to_None=False):
        """Zeroes (or drops) the grads of the masters, the float32 params and the half
        params."""
        zero_grads([p for g in self.optimizer.param_groups for p in g["params"]] + self.all_fp16_params,
                   set_grads_to_None)

    def _master_params_to_model_params(self):
        groups = {}
        for master, half in zip(self.all_fp32_from_fp16_params, self.all_fp16_params):
            groups.setdefault((half.device, half.dtype), []).append((master, half))
        for group in groups.values():
            with torch.no_grad():
                multi_tensor_scale([m for m, _ in group], [h for _, h in group], 1.0)

    def step(self, closure=None):
        """Steps the masters and copies them into the half params; after an overflow
        it skips (params, masters and optimizer state untouched) and returns None. A
        ``closure`` must call this object's ``zero_grad`` and ``backward``."""
        if self.overflow:
            self.maybe_print(f"Gradient overflow. Skipping step, loss scale reduced to {self.loss_scale}")
            return None
        result = self._step_with_closure(closure) if closure is not None else self.optimizer.step()
        self._master_params_to_model_params()
        return result

    def _step_with_closure(self, closure):
        def wrapped_closure():
            if self.first_closure_call_this_step:
                self.first_closure_call_this_step = False
            else:  # the optimizer moved the masters since the last evaluation (LBFGS)
                self._master_params_to_model_params()
            loss = closure()
            for _ in range(_CLOSURE_RETRIES):
                if not self.overflow:
                    return loss
                if not self.dynamic_loss_scale:
                    raise RuntimeError("FP16_Optimizer: the grads overflowed inside the closure with a "
                                       f"static loss scale ({self.loss_scale}); lower static_loss_scale "
                                       "or use dynamic_loss_scale=True")
                self.maybe_print(f"Gradient overflow inside the closure: retrying with loss scale "
                                 f"{self.loss_scale}")
                loss = closure()
            raise RuntimeError(f"FP16_Optimizer: the grads still overflowed after {_CLOSURE_RETRIES} "
                               "retries of the closure with a halved loss scale each: the loss is not finite")

        try:
            return self.optimizer.step(wrapped_closure)
        finally:
            self.first_closure_call_this_step = True

    # ---- checkpoints --------------------------------------------------------------------

    def state_dict(self):
        """The wrapped optimizer's state dict, the loss scaler's, ``overflow`` and the
        float32 masters: all that ``load_state_dict`` needs to resume exactly."""
        return {
            "loss_scaler": self.loss_scaler.state_dict(),
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "overflow": self.overflow,
            "first_closure_call_this_step": self.first_closure_call_this_step,
            "optimizer_state_dict": self.optimizer.state_dict(),
            "fp32_from_fp16": [[m.detach().clone() for m in g] for g in self.fp32_from_fp16_groups],
        }

    def load_state_dict(self, state_dict):
        """Loads ``state_dict()``'s output (after ``model.load_state_dict``, as in Apex:
        the masters loaded here replace the values the model's half params hold)."""
        scaler = state_dict["loss_scaler"]
        if not isinstance(scaler, Mapping):  # an object with Apex's interface
            scaler = {"scale": float(getattr(scaler, "loss_scale", getattr(scaler, "cur_scale", 1.0))),
                      "dynamic": bool(state_dict["dynamic_loss_scale"])}
        self.loss_scaler.load_state_dict(scaler)
        self.dynamic_loss_scale = bool(state_dict["dynamic_loss_scale"])
        self.overflow = state_dict["overflow"]
        self.first_closure_call_this_step = state_dict["first_closure_call_this_step"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        saved = state_dict["fp32_from_fp16"]
        if [len(g) for g in saved] != [len(g) for g in self.fp32_from_fp16_groups]:
            raise ValueError(f"state_dict['fp32_from_fp16'] holds {[len(g) for g in saved]} masters per "
                             f"group, this optimizer {[len(g) for g in self.fp32_from_fp16_groups]}")
        with torch.no_grad():
            for current_group, saved_group in zip(self.fp32_from_fp16_groups, saved):
                for current, value in zip(current_group, saved_group):
                    current.copy_(value)

    # ---- printing ---------------------------------------------------------------------------

    def __repr__(self):
        return f"FP16_Optimizer({self.optimizer!r}, loss_scale={self.loss_scale})"
