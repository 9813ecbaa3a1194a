"""FusedAdam: Apex's constructor, torch.optim.Adam / AdamW numerics, one fused kernel
call per (device, dtype) group."""

import warnings

from .._library import op
from ._base import FusedOptimizer
from .._sharded import elementwise


class FusedAdam(FusedOptimizer):
    """Adam (``adam_w_mode=False``: L2 in the gradient) or AdamW (default: decoupled
    weight decay), as ``apex.optimizers.FusedAdam``, on CPU and CUDA.

    Beyond Apex: ``amsgrad=True`` works; ``master_weights=True`` keeps fp32 master
    copies of fp16/bf16 params on any device and saves them in the state dict;
    ``maximize``; ``step(grad_scale=, found_inf=, max_grad_norm=)`` unscales, skips on
    overflow and clips by global norm inside the update (see ``FusedOptimizer``);
    state dicts load into and from ``torch.optim.Adam`` / ``AdamW``.
    """

    _state_keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True,
                 capturable=False, master_weights=False, maximize=False):
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=adam_w_mode, amsgrad=amsgrad,
                        maximize=maximize)
        super().__init__(params, defaults, set_grad_none=set_grad_none,
                         master_weights=master_weights, capturable=capturable)

    def _complete_group(self, group):
        # A torch.optim.Adam / AdamW state dict says which it was (one saved by torch 2.6
        # or older does not: the group keeps this optimizer's mode, and with weight decay
        # that is said), and torch always corrects the bias.
        if "decoupled_weight_decay" in group:
            group.setdefault("adam_w_mode", group["decoupled_weight_decay"])
        elif "adam_w_mode" not in group and group.get("weight_decay"):
            warnings.warn("a loaded param group says neither adam_w_mode nor decoupled_weight_decay (torch's Adam "
                          "and AdamW wrote neither before 2.7), so it is not known whether its weight decay was "
                          f"decoupled: it keeps this FusedAdam's adam_w_mode={self.defaults['adam_w_mode']}. "
                          "Build FusedAdam with the mode of the optimizer that saved it, or set "
                          "param_groups[i]['adam_w_mode'] after loading", stacklevel=4)
        group.setdefault("bias_correction", True)

    def state_dict(self):
        sd = super().state_dict()
        for group in sd["param_groups"]:
            group["decoupled_weight_decay"] = group["adam_w_mode"]  # for torch.optim to load
        return sd

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        beta1, beta2 = group["betas"]
        lr, lr_tensor = self._lr(group, device)
        elementwise(op("fused_adam_"), ps)(*self._lists(group, ps), lr, beta1, beta2, group["eps"],
                          group["weight_decay"], group["adam_w_mode"], group["bias_correction"],
                          group["amsgrad"], group["maximize"], lr_tensor, grad_scale, found_inf)

    def _lists(self, group, ps):
        make = dict(exp_avg=self._state_zeros, exp_avg_sq=self._state_zeros)
        if group["amsgrad"]:
            make["max_exp_avg_sq"] = self._state_zeros
        states, steps = self._state_lists(group, ps, **make)
        maxes = states[2] if group["amsgrad"] else []
        return ps, [p.grad for p in ps], states[0], states[1], maxes, self._masters(ps), steps
