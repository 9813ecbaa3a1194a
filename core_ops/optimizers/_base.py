"""What every fused optimizer shares: grouping params by (device, dtype), lazy state,
fp32 master weights, grad_scale / found_inf (torch.amp.GradScaler's fused protocol),
clipping by global norm folded into the update, and state dicts that interoperate
with torch.optim."""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch
from torch.optim import Optimizer

from .. import _build, _validate
from ..multi_tensor_apply import multi_tensor_l2norm

HALF = (torch.float16, torch.bfloat16)


def flag_overflow(found_inf, bad):
    """found_inf |= bad on the device, in place; returns found_inf, or ``bad`` when
    there is none. found_inf may be 0-d (torch's GradScaler, LossScaler) or one-element."""
    if found_inf is None:
        return bad
    bad = bad.to(found_inf.device, found_inf.dtype).reshape(found_inf.shape)
    found_inf.copy_(torch.maximum(found_inf, bad))
    return found_inf


class FusedOptimizer(Optimizer):
    # torch.amp.GradScaler.step() sets self.grad_scale / self.found_inf and lets the
    # step unscale and skip inside the kernel instead of unscaling grads first.
    _step_supports_amp_scaling = True
    # State tensors kept in the state dtype (float32) whatever the param dtype.
    _state_keys: tuple[str, ...] = ()

    def __init__(self, params, defaults, *, set_grad_none, master_weights=False, capturable=False):
        self.set_grad_none = set_grad_none
        self.master_weights = master_weights
        self.capturable = capturable
        self.last_grad_norm = None
        super().__init__(params, defaults)

    # ---- construction -------------------------------------------------------------

    def add_param_group(self, param_group):
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        if len({id(p) for p in params}) != len(params):
            raise ValueError(f"{type(self).__name__}: a parameter appears twice in one param group")
        super().add_param_group(param_group)

    # ---- grads --------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool | None = None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def _grouped(self, group):
        """Params of ``group`` that have grads, bucketed by (device, dtype)."""
        buckets = defaultdict(list)
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if p.grad.shape != p.shape:
                raise ValueError(f"a gradient of shape {tuple(p.grad.shape)} belongs to a param of "
                                 f"shape {tuple(p.shape)}")
            buckets[(p.device, p.dtype)].append(p)
        return buckets

    # ---- state --------------------------------------------------------------------

    def _step_tensor(self, p):
        return torch.zeros((), dtype=torch.float32, device=p.device)

    def _state_zeros(self, p):
        return torch.zeros_like(p, dtype=_validate.state_dtype(p.dtype), memory_format=torch.preserve_format)

    def _state_lists(self, ps, **make):
        """(one list per name in ``make``, steps): ``state[name]`` of each param in
        ``ps``, made by ``make[name](p)`` when missing (a first step, or amsgrad turned
        on later), and the step counters."""
        lists, steps = {name: [] for name in make}, []
        for p in ps:
            state = self.state[p]
            if "step" not in state:
                state["step"] = self._step_tensor(p)
            for name, fn in make.items():
                if name not in state:
                    state[name] = fn(p)
                lists[name].append(state[name])
            steps.append(state["step"])
        return list(lists.values()), steps

    def _masters(self, ps):
        """The fp32 masters of ``ps`` (an empty list without master weights)."""
        return [m for m in map(self._master, ps) if m is not None]

    def _master(self, p):
        """The fp32 master copy of a half param (created on first use), or None."""
        if not (self.master_weights and p.dtype in HALF):
            return None
        state = self.state[p]
        if "master_param" not in state:
            state["master_param"] = self._state_zeros(p).copy_(p.detach())
        return state["master_param"]

    # ---- scaling, skipping, clipping ---------------------------------------------

    def _scaling(self, grad_scale, found_inf, max_grad_norm, clip_eps=1e-6):
        """(grad_scale, found_inf) to hand the kernels: the caller's, or GradScaler's,
        with clipping by global norm folded into grad_scale (no host sync)."""
        grad_scale = grad_scale if grad_scale is not None else getattr(self, "grad_scale", None)
        found_inf = found_inf if found_inf is not None else getattr(self, "found_inf", None)
        if max_grad_norm is None:
            return grad_scale, found_inf
        if max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        norms = []
        for group in self.param_groups:
            for (device, _), ps in self._grouped(group).items():
                _build.ensure_for(device)
                norms.append(multi_tensor_l2norm([p.grad for p in ps])[0])
        if not norms:
            return grad_scale, found_inf
        device = norms[0].device
        dtype = torch.float64 if any(n.dtype == torch.float64 for n in norms) else torch.float32
        total = torch.linalg.vector_norm(torch.stack([n.to(device, dtype) for n in norms]))
        if grad_scale is not None:
            total = total / grad_scale.to(device, dtype).reshape(())
        found_inf = flag_overflow(found_inf, (~torch.isfinite(total)).float().reshape(1))
        self.last_grad_norm = total
        # grads / (scale / clip) = unscaled grads * clip, clip = min(1, max_norm / norm)
        # clip_eps=1e-6 as torch.nn.utils.clip_grad_norm_; LAMB passes 0 (Apex's
        # max_norm / max(norm, max_norm)).
        clip = torch.clamp(max_grad_norm / (total + clip_eps), max=1.0)
        divisor = clip.reciprocal() if grad_scale is None else grad_scale.to(device) / clip
        return divisor.reshape(1), found_inf

    # ---- the step ---------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale=None, found_inf=None, max_grad_norm=None, **scaler):
        """One update, one fused op call per (device, dtype) group of params.
        ``grad_scale``: grads are divided by it inside the kernel. ``found_inf``: a
        one-element tensor; when set, nothing changes (params, state, step counts).
        ``max_grad_norm``: clip by the global norm of the unscaled grads, in the same
        pass; the norm is kept in ``self.last_grad_norm`` and a non-finite norm sets
        ``found_inf`` (which is updated in place when given). ``grad_scaler=s``: the
        same as ``s.step(self)``, see ``_step_with_scaler``."""
        if scaler:
            return self._step_with_scaler(closure, **scaler)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = self._scaling(grad_scale, found_inf, *self._clipping(max_grad_norm))
        for group in self.param_groups:
            for (device, _), ps in self._grouped(group).items():
                _build.ensure_for(device)
                self._step_group(group, ps, device, self._on(grad_scale, device),
                                 self._on(found_inf, device))
        return loss

    def _clipping(self, max_grad_norm):
        """(max_grad_norm, clip_eps) for ``_scaling``; LAMB clips its own way."""
        return max_grad_norm, 1e-6

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        """The fused op call for params ``ps`` of ``group`` on ``device``, whose grads
        are checked; ``grad_scale`` / ``found_inf`` are already on ``device``."""
        raise NotImplementedError

    def _step_with_scaler(self, closure=None, grad_scaler=None, **unknown):
        """``step(grad_scaler=s)`` is ``s.step(self)``, for a ``torch.amp.GradScaler`` or
        a ``core_ops.amp.LossScaler``: the scaler's scale and overflow flag go into the
        kernel, nothing syncs, and an overflowed step changes nothing; call
        ``s.update()`` after it as usual. (The keyword stays out of the signature, where
        torch's GradScaler would take it for its deprecated protocol.)"""
        if unknown:
            raise TypeError(f"{type(self).__name__}.step() got unexpected keyword arguments "
                            f"{sorted(unknown)}")
        if grad_scaler is None:
            return self.step(closure)
        if closure is not None:
            raise RuntimeError("step(grad_scaler=...) takes no closure: it would run backward after "
                               "the overflow check")
        return grad_scaler.step(self)

    @staticmethod
    def _on(t, device):
        return None if t is None else t.to(device, non_blocking=True)

    def _lr(self, group, device):
        """(lr as float, lr as a device tensor or None) for the kernel."""
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            return 0.0, lr.to(device=device, dtype=torch.float32, non_blocking=True).reshape(1)
        return float(lr), None

    # ---- state dicts --------------------------------------------------------------

    def load_state_dict(self, state_dict):
        """torch.optim's loader casts state to the param dtype; core_ops keeps it (and
        master weights) in float32, so those are restored from the saved values
        exactly, in the param's memory layout, and steps move to the param's device."""
        saved_groups = state_dict["param_groups"]
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        ids = itertools.chain.from_iterable(g["params"] for g in saved_groups)
        params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(ids, params):
            saved = saved_state.get(pid)
            if not saved:
                continue
            state = self.state[p]
            for key in (*self._state_keys, "master_param"):
                value = saved.get(key)
                if not isinstance(value, torch.Tensor):
                    continue
                if value.shape != p.shape:
                    raise ValueError(f"state '{key}' of a param has shape {tuple(value.shape)} but the "
                                     f"param has shape {tuple(p.shape)}: the state dict is from another model")
                state[key] = self._state_zeros(p).copy_(value)
            if "step" in state:
                # A copy: torch's loader may hand back the very tensor of the source
                # optimizer, and both would then count every step.
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(
                    p.device, copy=True).reshape(())
