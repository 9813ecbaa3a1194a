"""FusedLAMB and FusedMixedPrecisionLamb: Apex's constructors, LAMB as in You et al.
2019 with Apex's options; two fused passes around one per-tensor norm pass."""

import torch

from .._library import op
from ..multi_tensor_apply import multi_tensor_l2norm
from ._base import HALF, FusedOptimizer


class FusedLAMB(FusedOptimizer):
    """LAMB, as ``apex.optimizers.FusedLAMB``: grads are clipped by their global norm
    (``max_grad_norm``, 0 disables), Adam-style moments give the update (decoupled
    weight decay with ``adam_w_mode``), and each tensor's step is scaled by its trust
    ratio ||p|| / ||update|| (only for tensors with weight decay, unless
    ``use_nvlamb``). Math: csrc/include/core_ops/lamb_math.h."""

    _state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
                 set_grad_none=True, max_grad_norm=1.0, use_nvlamb=False, master_weights=False,
                 maximize=False):
        if amsgrad:
            raise ValueError("FusedLAMB does not support amsgrad (nor did Apex's)")
        if not isinstance(lr, torch.Tensor) and lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps < 0 or weight_decay < 0 or max_grad_norm < 0:
            raise ValueError("eps, weight_decay and max_grad_norm must be >= 0")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=adam_w_mode,
                        grad_averaging=grad_averaging, max_grad_norm=max_grad_norm,
                        use_nvlamb=use_nvlamb, maximize=maximize)
        super().__init__(params, defaults, set_grad_none=set_grad_none, master_weights=master_weights)

    def _clipping(self, max_grad_norm):
        # Apex: the constructor's max_grad_norm (of the first param group; the norm is
        # over all groups together), clip = max_norm / max(norm, max_norm).
        if max_grad_norm is not None:
            raise TypeError(f"{type(self).__name__}.step() takes no max_grad_norm: LAMB clips by "
                            "the constructor's max_grad_norm")
        return self.param_groups[0]["max_grad_norm"] or None, 0.0

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        beta1, beta2 = group["betas"]
        lr, lr_tensor = self._lr(group, device)
        (exp_avgs, exp_avg_sqs), steps = self._state_lists(
            ps, exp_avg=self._state_zeros, exp_avg_sq=self._state_zeros)
        masters = self._masters(ps)
        updates = [self._state_zeros(p) for p in ps]
        op("fused_lamb_stage1_")(ps, [p.grad for p in ps], exp_avgs, exp_avg_sqs, masters, steps,
                                 updates, beta1, beta2, group["eps"], group["weight_decay"],
                                 group["adam_w_mode"], group["bias_correction"],
                                 group["grad_averaging"], group["maximize"], grad_scale, found_inf)
        weights = masters or ps
        _, param_norms = multi_tensor_l2norm(weights, per_tensor=True)
        _, update_norms = multi_tensor_l2norm(updates, per_tensor=True)
        op("fused_lamb_stage2_")(ps, masters, updates, param_norms.to(updates[0].dtype),
                                 update_norms, lr, group["weight_decay"], group["use_nvlamb"],
                                 lr_tensor, found_inf)


class FusedMixedPrecisionLamb(FusedLAMB):
    """LAMB for reduced-precision params with float32 master weights, as Apex's
    ``FusedMixedPrecisionLamb``: the model's params stay in ``reduced_precision_dtype``
    (fp16 or bf16), the optimizer updates float32 masters (saved in the state dict)."""

    def __init__(self, params, lr=1e-3, step=0, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
                 max_grad_norm=1.0, use_nvlamb=False, reduced_precision_dtype=None, set_grad_none=True):
        if reduced_precision_dtype not in (None, *HALF):
            raise ValueError(f"reduced_precision_dtype must be torch.float16 or torch.bfloat16, got "
                             f"{reduced_precision_dtype}")
        if step != 0:
            raise ValueError("step: a starting step count is restored with load_state_dict, not set here")
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adam_w_mode=adam_w_mode,
                         grad_averaging=grad_averaging, set_grad_none=set_grad_none,
                         max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb, master_weights=True)
        self.reduced_precision_dtype = reduced_precision_dtype
        for group in self.param_groups:
            for p in group["params"]:
                if reduced_precision_dtype is not None and p.dtype not in (reduced_precision_dtype, torch.float32):
                    raise ValueError(f"a param has dtype {p.dtype}, expected {reduced_precision_dtype} "
                                     "or float32")
