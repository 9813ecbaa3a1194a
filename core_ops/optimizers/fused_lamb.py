"""FusedLAMB and FusedMixedPrecisionLamb: Apex's constructors, LAMB as in You et al.
2019 with Apex's options; two fused passes around one per-tensor norm pass."""

import torch

from .._schemas import op
from ..multi_tensor_apply import multi_tensor_l2norm
from ._base import HALF, FusedOptimizer
from .._sharded import elementwise, is_sharded, locals_of, whole_norms


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
                 maximize=False, skip_nonfinite=False):
        defaults = _lamb_defaults(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                  weight_decay=weight_decay, amsgrad=amsgrad, adam_w_mode=adam_w_mode,
                                  grad_averaging=grad_averaging, max_grad_norm=max_grad_norm,
                                  use_nvlamb=use_nvlamb, maximize=maximize)
        super().__init__(params, defaults, set_grad_none=set_grad_none, master_weights=master_weights,
                         skip_nonfinite=skip_nonfinite)

    def _clipping(self, max_grad_norm):
        # Apex: the constructor's max_grad_norm, self.defaults['max_grad_norm'] (one
        # norm over all groups together, so one limit), clip = max_norm / max(norm, max_norm).
        if max_grad_norm is not None:
            raise TypeError(f"{type(self).__name__}.step() takes no max_grad_norm: LAMB clips by "
                            "the constructor's max_grad_norm")
        return self.defaults["max_grad_norm"] or None, 0.0

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        lr, lr_tensor = self._lr(group, device)
        (exp_avgs, exp_avg_sqs), steps = self._state_lists(
            group, ps, exp_avg=self._state_zeros, exp_avg_sq=self._state_zeros)
        args = (ps, [p.grad for p in ps], exp_avgs, exp_avg_sqs, self._masters(ps), steps)
        if device.type != "cpu" or torch.compiler.is_compiling() or any(map(is_sharded, ps)):
            # Sharded params (FSDP2): both stages are elementwise on the local shards;
            # the trust ratio takes each whole tensor's norms (Note [Sharded params]),
            # the weights' and the updates' reduced together.
            updates = [self._state_zeros(p) for p in ps]
            elementwise(op("fused_lamb_stage1_"), ps)(*args, updates, *self._stage1_options(group, grad_scale,
                                                                                             found_inf))
            _, param_norms = multi_tensor_l2norm(locals_of(args[4] or ps), per_tensor=True)
            _, update_norms = multi_tensor_l2norm(locals_of(updates), per_tensor=True)
            if any(map(is_sharded, ps)):
                param_norms, update_norms = whole_norms(
                    ps + ps, torch.cat([param_norms, update_norms.to(param_norms.dtype)])).split(len(ps))
            elementwise(op("fused_lamb_stage2_"), ps)(ps, args[4], updates, param_norms.to(updates[0].dtype),
                                                      update_norms, lr, group["weight_decay"], group["use_nvlamb"],
                                                      lr_tensor, found_inf)
            return
        # Note [LAMB in batches on the CPU]
        start, total = 0, 0
        for i, p in enumerate(ps):
            if total and total + p.numel() > _BATCH:
                self._cpu_batch(group, [a[start:i] for a in args], lr, lr_tensor, grad_scale, found_inf)
                start, total = i, 0
            total += p.numel()
        self._cpu_batch(group, [a[start:] for a in args] if start else args, lr, lr_tensor, grad_scale, found_inf)

    @staticmethod
    def _stage1_options(group, grad_scale, found_inf):
        beta1, beta2 = group["betas"]
        return (beta1, beta2, group["eps"], group["weight_decay"], group["adam_w_mode"], group["bias_correction"],
                group["grad_averaging"], group["maximize"], grad_scale, found_inf)

    def _cpu_batch(self, group, args, lr, lr_tensor, grad_scale, found_inf):
        """Both stages over one batch of Note [LAMB in batches on the CPU]: ``args``
        (params, grads, exp_avgs, exp_avg_sqs, masters, steps) of plain CPU tensors."""
        ps, masters = args[0], args[4]
        updates = self._updates(ps)
        op("fused_lamb_stage1_")(*args, updates, *self._stage1_options(group, grad_scale, found_inf))
        weights = masters or ps
        if weights[0].dtype == updates[0].dtype:  # both norms in one call
            param_norms, update_norms = op("multi_tensor_l2norm")(weights + updates, True)[1].split(len(ps))
        else:
            _, param_norms = op("multi_tensor_l2norm")(weights, True)
            _, update_norms = op("multi_tensor_l2norm")(updates, True)
        op("fused_lamb_stage2_")(ps, masters, updates, param_norms.to(updates[0].dtype), update_norms, lr,
                                 group["weight_decay"], group["use_nvlamb"], lr_tensor, found_inf)

    def _updates(self, ps):
        """Tensors laid out as ``ps`` for their updates (as empty_like would make them):
        views of the optimizer's buffer, made once for each batch's shapes and strides."""
        dtype = self._state_zeros(ps[0][:0]).dtype
        sizes = [p.numel() for p in ps]
        key = (dtype, *((p.shape, p.stride()) for p in ps))
        views = self.__dict__.setdefault("_update_views", {})
        made = views.get(key)
        if made is None:
            if len(views) >= _KEPT_LAYOUTS:  # params whose grads come and go (MoE experts)
                views.clear()
            total, buffer = sum(sizes), self.__dict__.get("_update_buffer")
            if buffer is None or buffer.dtype != dtype or buffer.numel() < total:
                buffer = self._update_buffer = torch.empty(total, dtype=dtype)
                views.clear()  # views of the buffer given up keep it alive
            made = views[key] = [_laid_out_as(p, u) for u, p in zip(buffer[:total].split(sizes), ps)]
        return made


def _laid_out_as(p, flat):
    """``flat`` (p.numel() elements) viewed with the shape and strides empty_like(p)
    gives: p's own for a dense param (channels_last included), else contiguous."""
    if p.is_contiguous():
        return flat.view(p.shape)
    return flat.as_strided(p.shape, torch.empty_like(p, device="meta").stride())


# Note [LAMB in batches on the CPU]: the second stage scales each tensor's update by
# its norm, so every update is held in memory between the stages. Made for all params
# at once, the updates are a fresh allocation the size of the model every step, which
# glibc maps anew from the kernel each time (page faults and pages zeroed by the
# kernel: 1.3-1.4x the batched step's time, measured on 25M params). On the CPU the
# tensors go through in batches of at most _BATCH elements (a larger tensor is a batch
# of its own) whose updates share one buffer the optimizer keeps: 2^20 elements, or the
# largest tensor's size where that is larger, so a step's peak memory stays below that
# of the model-sized allocation it replaces. Each
# tensor's norms and step are its own (the clipping norm was taken over all grads
# before), so batches change no result, and a batch's weights and updates are still in
# cache when the norm pass and stage 2 read them again. FSDP2's shards and compiled
# steps take one batch (their norms reduce across ranks; dynamo would trace the loop),
# as does the GPU.
_BATCH = 1 << 20
_KEPT_LAYOUTS = 64  # batches' views kept: one set a layout of params with grads seen


class FusedMixedPrecisionLamb(FusedLAMB):
    """LAMB for reduced-precision params with float32 master weights, as Apex's
    ``FusedMixedPrecisionLamb``: the model's params stay in ``reduced_precision_dtype``
    (fp16 or bf16), the optimizer updates float32 masters (saved in the state dict).
    Beyond Apex, as every fused optimizer: ``maximize`` and ``skip_nonfinite``."""

    _pickled_attrs = (*FusedLAMB._pickled_attrs, "reduced_precision_dtype")

    def __init__(self, params, lr=1e-3, step=0, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
                 max_grad_norm=1.0, use_nvlamb=False, reduced_precision_dtype=None, set_grad_none=True,
                 maximize=False, skip_nonfinite=False):
        if reduced_precision_dtype not in (None, *HALF):
            raise ValueError(f"reduced_precision_dtype must be torch.float16 or torch.bfloat16, got "
                             f"{reduced_precision_dtype}")
        self.reduced_precision_dtype = reduced_precision_dtype  # read by _check_group
        # step: Apex's starting step count, kept per group as Apex does (see _step_tensor).
        defaults = dict(_lamb_defaults(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                       weight_decay=weight_decay, amsgrad=amsgrad, adam_w_mode=adam_w_mode,
                                       grad_averaging=grad_averaging, max_grad_norm=max_grad_norm,
                                       use_nvlamb=use_nvlamb, maximize=maximize), step=step)
        FusedOptimizer.__init__(self, params, defaults, set_grad_none=set_grad_none, master_weights=True,
                                skip_nonfinite=skip_nonfinite)

    def _check_group(self, group, where):
        super()._check_group(group, where)
        low = HALF if self.reduced_precision_dtype is None else (self.reduced_precision_dtype,)
        for i, p in enumerate(group["params"]):
            if p.dtype not in (*low, torch.float32):
                raise ValueError(f"{where}params[{i}] has dtype {p.dtype}, expected float32 or "
                                 f"{' or '.join(map(str, low))} (reduced_precision_dtype="
                                 f"{self.reduced_precision_dtype})")


def _lamb_defaults(*, amsgrad, betas, **kwargs):
    if amsgrad:
        raise ValueError("FusedLAMB does not support amsgrad (nor did Apex's)")
    return dict(kwargs, betas=tuple(betas))
