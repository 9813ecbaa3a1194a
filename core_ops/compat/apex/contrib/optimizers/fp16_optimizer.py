"""Apex's ``contrib.optimizers.FP16_Optimizer``: the cut-down FP16_Optimizer for
contrib's ``FusedAdam`` and ``FusedSGD``. It keeps float32 masters as the optimizer's
params and hands the model's (scaled) grads, the model params to write back and the
scale to the optimizer's step, which unscales inside. An overflow (found by the
multi-tensor norm of the half grads) skips the step and, with a dynamic scale, halves
it; ``scale_window`` clean steps double it (Apex's: 2**16 to start, window 1000)."""

from __future__ import annotations

import torch

from .....multi_tensor_apply import multi_tensor_l2norm
from .....settings import INIT_LOSS_SCALE
from ...fp16_utils.fp16util import zero_grads
from ...fp16_utils.loss_scaler import windowed_update
from ..._wrapper import ForwardsToOptimizer


class FP16_Optimizer(ForwardsToOptimizer):
    def __init__(self, init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False,
                 dynamic_loss_args=None, verbose=True):
        if dynamic_loss_args is not None:
            raise SystemError("Do not support dynamic loss scale args for now.")  # Apex's refusal
        self.optimizer = init_optimizer
        self.fp16_groups, self.fp32_groups = [], []
        for group in init_optimizer.param_groups:
            halves = list(group["params"])
            masters = [p.detach().clone().float() for p in halves]
            self.fp16_groups.append(halves)
            self.fp32_groups.append(masters)
            group["params"] = masters
        self.dynamic_loss_scale = bool(dynamic_loss_scale)
        self.cur_scale = INIT_LOSS_SCALE if dynamic_loss_scale else static_loss_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2
        self.scale_window = 1000
        self.verbose = verbose

    def zero_grad(self, set_grads_to_None=True):
        zero_grads([p for g in self.fp16_groups for p in g], set_grads_to_None)

    def backward(self, loss):
        (loss.float() * self.cur_scale).backward()

    def step(self, closure=None):
        if closure is not None:
            raise RuntimeError("contrib's FP16_Optimizer does not take a closure")
        grads = [[p.grad for p in group] for group in self.fp16_groups]
        norms, overflow = [], False
        for group_grads in grads:
            present = [g for g in group_grads if g is not None]
            if present:
                norm = multi_tensor_l2norm(present)[0]
                norms.append(norm)
                overflow = overflow or not bool(torch.isfinite(norm))
        if overflow:
            self._update_scale(True)
            return None
        self.optimizer.step(grads=grads, output_params=self.fp16_groups, scale=self.cur_scale, grad_norms=norms)
        self._update_scale(False)
        return None

    def _update_scale(self, skip):
        if skip and self.verbose:
            print(f"\nGrad overflow on iteration {self.cur_iter}; loss scale {self.cur_scale}")
        if self.dynamic_loss_scale:
            self.cur_scale, self.last_overflow_iter = windowed_update(
                self.cur_scale, self.scale_factor, self.scale_window, self.cur_iter, self.last_overflow_iter, skip)
        self.cur_iter += 1

    def state_dict(self):
        state = {"dynamic_loss_scale": self.dynamic_loss_scale, "cur_scale": self.cur_scale,
                 "cur_iter": self.cur_iter, "optimizer_state_dict": self.optimizer.state_dict(),
                 "fp32_groups": [[m.detach().clone() for m in g] for g in self.fp32_groups]}
        if self.dynamic_loss_scale:
            state.update(last_overflow_iter=self.last_overflow_iter, scale_factor=self.scale_factor,
                         scale_window=self.scale_window)
        return state

    def load_state_dict(self, state_dict):
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.cur_scale = state_dict["cur_scale"]
        self.cur_iter = state_dict["cur_iter"]
        if self.dynamic_loss_scale:
            self.last_overflow_iter = state_dict["last_overflow_iter"]
            self.scale_factor = state_dict["scale_factor"]
            self.scale_window = state_dict["scale_window"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        with torch.no_grad():
            for current, saved in zip(self.fp32_groups, state_dict["fp32_groups"], strict=True):
                for c, s in zip(current, saved, strict=True):
                    c.copy_(s)
