"""FusedNovoGrad: Apex's constructor and semantics (NovoGrad, Ginsburg et al. 2019, with
layer-wise second moments); one norm pass and one fused kernel call per (device, dtype)
group."""

import torch

from .. import _validate
from .._schemas import op
from ..multi_tensor_apply.ops import per_tensor_norms
from ._base import FusedOptimizer
from .._sharded import elementwise, locals_of, whole_norms


class FusedNovoGrad(FusedOptimizer):
    """NovoGrad, as ``apex.optimizers.FusedNovoGrad``. Each tensor (layer) keeps one
    second moment ``v``: with ``norm_type=2`` the running mean of its squared L2 grad
    norm, the layer's norm being ``sqrt(v)``; with ``norm_type=0`` the running mean of
    max|g| itself, the layer's norm being ``v``. ``denom = norm / sqrt(bc2) + eps``.
    ``reg_inside_moment=False`` (default): the momentum is of the raw grad, and the
    normalisation and weight decay act on the update term only,
    ``p -= lr * (m_hat / denom + wd * p)``. ``True`` (the paper's form): both go into
    the momentum, ``m = beta1*m + beta3*(g/denom + wd*p)``, ``p -= lr * m_hat``.
    Math: csrc/include/core_ops/novograd_math.h.

    State per param: ``exp_avg`` (like the param, float32), ``exp_avg_sq`` (a 0-d
    float32 tensor holding ``v`` above, so a max-norm with ``norm_type=0`` despite the
    name; per param rather than Apex's per-group list, so params that have no grad on
    some step, param groups and state dicts need no bookkeeping), ``step`` and, with
    ``master_weights``, ``master_param``. ``amsgrad=True`` raises ValueError (Apex never
    supported it). Beyond Apex: ``master_weights``, ``maximize`` and
    ``step(grad_scale=, found_inf=, max_grad_norm=)`` as in ``FusedAdam``.
    """

    _state_keys = ("exp_avg",)  # exp_avg_sq is 0-d: restored by load_state_dict below

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, reg_inside_moment=False, grad_averaging=True,
                 norm_type=2, init_zero=False, set_grad_none=True, master_weights=False,
                 maximize=False, skip_nonfinite=False):
        if amsgrad:
            raise ValueError("FusedNovoGrad: amsgrad is not supported (nor was it in Apex)")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, reg_inside_moment=reg_inside_moment,
                        grad_averaging=grad_averaging, norm_type=norm_type, init_zero=init_zero,
                        maximize=maximize)
        super().__init__(params, defaults, set_grad_none=set_grad_none, master_weights=master_weights,
                         skip_nonfinite=skip_nonfinite)

    def _check_group(self, group, where):
        super()._check_group(group, where)
        if group["norm_type"] not in (0, 2):
            raise ValueError(f"{where}norm_type must be 2 (L2) or 0 (infinity norm), got {group['norm_type']}")

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        # The layer norms are taken of the grads as they are (scaled) and divided by
        # the grad scale inside the kernel, so no host sync.
        beta1, beta2 = group["betas"]
        lr, lr_tensor = self._lr(group, device)
        (exp_avgs, exp_avg_sqs), steps = self._state_lists(
            group, ps, exp_avg=self._state_zeros, exp_avg_sq=self._scalar_zeros)
        masters = self._masters(ps)
        grads = [p.grad for p in ps]
        # Each whole tensor's norm, also of sharded params (Note [Sharded params]).
        norms = whole_norms(ps, per_tensor_norms(locals_of(grads), group["norm_type"], exp_avg_sqs[0].dtype),
                            group["norm_type"])
        if found_inf is not None:
            # Under a loss scaler: finite grads whose norm overflows float32 would put
            # inf into exp_avg_sq for good; skip the step, so the scale backs off
            # (Note [Overflowing norms] in _base.py).
            self._flag_overflow(found_inf, ~torch.isfinite(norms).all())
        elementwise(op("fused_novograd_"), ps)(ps, grads, exp_avgs, exp_avg_sqs, masters, steps, norms,
                              group["norm_type"], lr, beta1, beta2, group["eps"],
                              group["weight_decay"], group["bias_correction"],
                              group["reg_inside_moment"], group["grad_averaging"],
                              group["init_zero"], group["maximize"], lr_tensor, grad_scale, found_inf)

    def _scalar_zeros(self, p):
        return torch.zeros((), dtype=_validate.state_dtype(p.dtype), device=p.device)

    def _prepare_loaded(self, state_dict):
        """Apex's FusedNovoGrad checkpoints load too (``_from_apex``)."""
        return self._from_apex(state_dict)

    def _restore_exact(self, state_dict):
        """As ``FusedOptimizer._restore_exact``, and ``exp_avg_sq`` (one value per
        tensor) restored exactly in float32 too."""
        super()._restore_exact(state_dict)
        for saved, p in self._saved_states(state_dict):
            value = saved.get("exp_avg_sq")
            if isinstance(value, torch.Tensor):
                self.state[p]["exp_avg_sq"] = self._scalar_zeros(p).copy_(value.reshape(()))

    def _from_apex(self, state_dict):
        """Apex's FusedNovoGrad keeps the layer norms in each param group
        (``group['exp_avg_sq'] = [fp16 norms, fp32 norms]``, one value per param of that
        dtype, in the group's order, as norms where core_ops keeps the blended square
        for ``norm_type=2``) and the step count in the group. Returns ``state_dict``
        with them moved into each param's state (the group's step is read by
        ``_step_tensor``); a state dict without them is returned as it is."""
        groups = state_dict.get("param_groups", [])
        if not any("exp_avg_sq" in g for g in groups):
            return state_dict
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(groups)} param groups but the optimizer has "
                             f"{len(self.param_groups)}")
        state = {k: dict(v) for k, v in state_dict["state"].items()}
        saved_groups = [dict(g) for g in groups]
        for i, (saved, live) in enumerate(zip(saved_groups, self.param_groups)):
            norms = saved.pop("exp_avg_sq", None)
            if norms is None:
                continue
            if len(saved["params"]) != len(live["params"]):
                raise ValueError(f"param group {i} of the state dict has {len(saved['params'])} params "
                                 f"but the optimizer's has {len(live['params'])}")
            for dtype, values in zip((torch.float16, torch.float32), norms):
                ids = [pid for pid, p in zip(saved["params"], live["params"]) if p.dtype == dtype]
                count = 0 if values is None else values.numel()
                if count != len(ids):
                    raise ValueError(
                        f"param group {i} of the Apex FusedNovoGrad state dict holds {count} "
                        f"{dtype} layer norms for {len(ids)} {dtype} params: some params had no "
                        "grad on Apex's first step, so which norm is whose is unknown")
                for pid, norm in zip(ids, [] if values is None else values.reshape(-1).float()):
                    v = norm.square() if saved.get("norm_type", live["norm_type"]) == 2 else norm
                    state[pid] = dict(state.get(pid, {}), exp_avg_sq=v.cpu())
        return dict(state_dict, state=state, param_groups=saved_groups)

    def _check_loadable(self, state_dict):
        super()._check_loadable(state_dict)
        for saved, _ in self._saved_states(state_dict):
            value = saved.get("exp_avg_sq")
            if isinstance(value, torch.Tensor) and value.numel() != 1:
                raise ValueError(f"state 'exp_avg_sq' of a param has shape {tuple(value.shape)}, not one "
                                 "value per tensor: the state dict is not from FusedNovoGrad")
