"""LARC: Apex's layer-wise adaptive rate wrapper around any optimizer, with the
per-tensor norms taken by one multi-tensor pass per (device, dtype) and no host sync
(Apex synced twice per parameter to test the norms for zero)."""

from collections import defaultdict

import torch

from ..multi_tensor_apply import multi_tensor_l2norm


class LARC:
    """Wraps ``optimizer``: before each step, every param's grad becomes
    ``(g + wd*p) * adaptive_lr`` with ``adaptive_lr = trust_coefficient * ||p|| /
    (||g|| + wd*||p|| + eps)`` (clipped to ``min(adaptive_lr / lr, 1)`` when ``clip``,
    so LARC only ever lowers the optimizer's lr), and the optimizer runs with weight
    decay 0 (LARC applied it). A param whose weight or grad norm is 0 is left as is.
    Same arguments and semantics as ``apex.parallel.LARC``."""

    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8):
        if trust_coefficient <= 0 or eps < 0:
            raise ValueError("trust_coefficient must be > 0 and eps >= 0")
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self.eps = eps

    # The wrapped optimizer's interface, so schedulers, GradScaler and checkpoints work.
    def __getstate__(self):
        return self.optim.__getstate__()

    def __setstate__(self, state):
        self.optim.__setstate__(state)

    def __repr__(self):
        return f"LARC({self.optim!r}, trust_coefficient={self.trust_coefficient}, clip={self.clip})"

    @property
    def state(self):
        return self.optim.state

    @property
    def param_groups(self):
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    @property
    def defaults(self):
        return self.optim.defaults

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none=True):
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    @torch.no_grad()
    def _adapt(self, group):
        wd = group.get("weight_decay", 0.0)
        lr = group["lr"]
        buckets = defaultdict(list)
        for p in group["params"]:
            if p.grad is not None:
                buckets[(p.device, p.dtype)].append(p)
        for ps in buckets.values():
            grads = [p.grad for p in ps]
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

    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        weight_decays = []
        for group in self.optim.param_groups:
            self._adapt(group)
            weight_decays.append(group.get("weight_decay", 0.0))
            group["weight_decay"] = 0.0
        try:
            self.optim.step(**kwargs)
        finally:
            for group, wd in zip(self.optim.param_groups, weight_decays):
                group["weight_decay"] = wd
        return loss
