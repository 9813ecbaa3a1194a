"""LARC: Apex's layer-wise adaptive rate wrapper around any optimizer, with the
per-tensor norms taken by one multi-tensor pass per (device, dtype) and no host sync
(Apex synced twice per parameter to test the norms for zero)."""

from collections import OrderedDict, defaultdict

import torch
from torch.optim import Optimizer

from .._forwarding import forwarded
from ..multi_tensor_apply import multi_tensor_l2norm
from ._checks import check_scale_args


class LARC(Optimizer):
    """Wraps ``optimizer``: before each step, every param's grad becomes
    ``(g + wd*p) * adaptive_lr`` with ``adaptive_lr = trust_coefficient * ||p|| /
    (||g|| + wd*||p|| + eps)`` (clipped to ``min(adaptive_lr / lr, 1)`` when ``clip``,
    so LARC only ever lowers the optimizer's lr), and the optimizer runs with weight
    decay 0 (LARC applied it). A param whose weight or grad norm is 0 is left as is.
    Same arguments and semantics as ``apex.parallel.LARC``.

    A ``torch.optim.Optimizer`` whose ``param_groups``, ``state`` and ``defaults`` are
    the wrapped optimizer's, so LR schedulers, GradScaler (``scaler.step(larc)``),
    state dicts, deepcopy and pickling work on it.
    """

    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8):
        if not (hasattr(optimizer, "param_groups") and callable(getattr(optimizer, "step", None))):
            raise TypeError(f"LARC wraps an optimizer (LARC(FusedSGD(params, lr=...))), got "
                            f"{type(optimizer).__name__}")
        if not trust_coefficient > 0:
            raise ValueError(f"trust_coefficient must be > 0, got {trust_coefficient}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        # Not Optimizer.__init__: it would give LARC param groups and state of its own.
        self.__setstate__(dict(optim=optimizer, trust_coefficient=trust_coefficient, clip=clip, eps=eps))

    def __getstate__(self):
        # Optimizer's __getstate__ would save the wrapped optimizer's groups as LARC's.
        return {k: self.__dict__[k] for k in ("optim", "trust_coefficient", "clip", "eps")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                      "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                      "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, OrderedDict())
        self._patch_step_function()

    def __repr__(self):
        return f"LARC({self.optim!r}, trust_coefficient={self.trust_coefficient}, clip={self.clip})"

    state = forwarded("optim", "state")
    param_groups = forwarded("optim", "param_groups", settable=True)
    defaults = forwarded("optim", "defaults")

    # The wrapped optimizer's state dict, with the state-dict hooks registered on LARC
    # itself run around it, as torch.optim.Optimizer runs them. (Global step hooks see
    # two steps per LARC step, LARC's and the wrapped optimizer's: both are optimizers.)
    def state_dict(self):
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        state_dict = self.optim.state_dict()
        for hook in self._optimizer_state_dict_post_hooks.values():
            state_dict = hook(self, state_dict) or state_dict
        return state_dict

    def load_state_dict(self, state_dict):
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            state_dict = hook(self, state_dict) or state_dict
        self.optim.load_state_dict(state_dict)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def zero_grad(self, set_to_none=None):
        """The wrapped optimizer's zero_grad, with its own default (e.g. FusedSGD's
        ``set_grad_none=False``) unless ``set_to_none`` is given."""
        if set_to_none is None:
            self.optim.zero_grad()
        else:
            self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    @torch.no_grad()
    def _adapt(self, group, grad_scale):
        wd = group.get("weight_decay", 0.0)
        lr = group["lr"]
        buckets = defaultdict(list)
        for p in group["params"]:
            if p.grad is not None:
                buckets[(p.device, p.dtype)].append(p)
        for (device, _), ps in buckets.items():
            grads = [p.grad for p in ps]
            if grad_scale is not None:
                # The trust ratio and the decay are of the true grads: unscale first, in
                # place, as GradScaler.unscale_ would.
                torch._foreach_div_(grads, grad_scale.to(device, torch.float32).reshape(()))
            _, pn = multi_tensor_l2norm(ps, per_tensor=True)
            _, gn = multi_tensor_l2norm(grads, per_tensor=True)
            adaptive = self.trust_coefficient * pn / (gn + pn * wd + self.eps)
            if self.clip:
                adaptive = torch.clamp(adaptive / lr, max=1.0)
            ok = (pn != 0) & (gn != 0)
            factor = torch.where(ok, adaptive, torch.ones_like(adaptive))
            decay = torch.where(ok, torch.full_like(adaptive, wd), torch.zeros_like(adaptive))
            for i, (p, g) in enumerate(zip(ps, grads)):
                g.add_(p * decay[i].to(p.dtype)).mul_(factor[i].to(g.dtype))

    def step(self, closure=None, *, grad_scale=None, found_inf=None, grad_scaler=None, **kwargs):
        """``grad_scale``: the grads are unscaled (in place) before LARC's norms;
        ``found_inf`` and other keywords go to the wrapped optimizer's step.
        ``grad_scaler=s`` is ``s.step(self)``: the scaler unscales, then steps."""
        if grad_scaler is not None:
            if closure is not None or grad_scale is not None or found_inf is not None or kwargs:
                raise TypeError("LARC.step(grad_scaler=...) takes no other arguments: the scaler "
                                "supplies the scale and the overflow flag")
            return grad_scaler.step(self)
        check_scale_args(grad_scale, found_inf)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        weight_decays = []
        for group in self.optim.param_groups:
            self._adapt(group, grad_scale)
            weight_decays.append(group.get("weight_decay", 0.0))
            group["weight_decay"] = 0.0
        if found_inf is not None:
            kwargs["found_inf"] = found_inf
        try:
            self.optim.step(**kwargs)
        finally:
            for group, wd in zip(self.optim.param_groups, weight_decays):
                group["weight_decay"] = wd
        return loss
