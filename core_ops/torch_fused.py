"""Backend 3 of Note [Backends] (native/__init__.py): ops on torch's own fused kernels
where no native library is loaded.

Note [Torch's fused kernels]: for the ops whose math torch has as one fused kernel
(``torch._fused_adam_`` / ``_fused_adamw_``, ``_fused_sgd_``, ``_fused_adagrad_``,
``_amp_foreach_non_finite_check_and_unscale_``, ``_foreach_norm``), that kernel serves a
call whose arguments it takes: plain float32 / float64 tensors, dense and contiguous,
the state in the params' dtype, no master weights, and the options torch has (no
Apex-only ones such as ``wd_after_momentum``, ``adagrad_w_mode`` or
``bias_correction=False``); any other call goes on to backend 4, the reference. A GPU
box with no CUDA toolkit (torch's pip wheels carry none) thus still steps at torch's
fused speed instead of the reference's. Backends 3 and 4 are registered as one
CompositeExplicitAutograd kernel per op (_fallback.py); a native kernel, once loaded,
takes its device's key over it. Results agree with the reference within the
tolerances its tests state (torch's fused Adam forms its moments with fused
multiply-adds and float32 hyperparameters: a few ulps a step,
tests/test_torch_backend.py). ``CORE_OPS_BACKEND=reference`` passes backend 3 over too.

The steps: torch's fused optimizers read step counts already advanced and leave the
advancing to their Python callers; core_ops' ops advance them themselves, and not
on a skipped step. Here they are advanced before the kernel and taken back by the
device-side flag after it: no host sync.
"""

from __future__ import annotations

import torch

from . import native
from ._validate import check_lists
from .reference import KERNELS as REFERENCE

_PLAIN = (torch.float32, torch.float64)


def _available(name):
    return getattr(torch, name, None) is not None


def _fits(params, *lists, steps=None):
    """Whether torch's kernel takes these lists as they are: contiguous strided float32 /
    float64 tensors of one dtype and device, each list (but an empty one) holding one
    tensor of its param's shape per param, and one-element float32 step counts
    (torch's CPU kernels check none of the shapes). Set and list comprehensions, not
    a per-tensor loop: this runs on every step (0.2 ms for 800 tensors, bench_backends.py).
    Anything else goes to the reference, whose checks then name what is wrong."""
    if native.forced_reference() or not params:
        return False
    first, n = params[0], len(params)
    lists = [params, *[ts for ts in lists if ts]]
    if first.dtype not in _PLAIN or any(len(ts) != n for ts in lists):
        return False
    if {(t.dtype, t.device, t.layout) for ts in lists for t in ts} != {(first.dtype, first.device, torch.strided)}:
        return False
    shapes = [p.shape for p in params]
    if any([t.shape for t in ts] != shapes for ts in lists[1:]):
        return False
    if not all(all(map(torch.Tensor.is_contiguous, ts)) for ts in lists):
        return False
    return steps is None or (len(steps) == n and {(s.dtype, s.device, s.layout, s.numel()) for s in steps}
                             == {(torch.float32, first.device, torch.strided, 1)})


def _flag(found_inf):
    """torch's kernels skip on a float32 flag equal to 1; core_ops' ops on any flag > 0."""
    return None if found_inf is None else (found_inf > 0).to(torch.float32).reshape(())


def _scale(grad_scale):
    return None if grad_scale is None else grad_scale.to(torch.float32).reshape(())


def _lr(lr, lr_tensor, like):
    return lr if lr_tensor is None else lr_tensor.to(like.device, torch.float32).reshape(())


def _stepped(steps, flag, kernel):
    """Advance ``steps``, run ``kernel``, take the steps back where ``flag`` is set."""
    torch._foreach_add_(steps, 1.0)
    kernel()
    if flag is not None:
        torch._foreach_sub_(steps, [flag.to(s.dtype) for s in steps])


def fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps,
                lr, beta1, beta2, eps, weight_decay, adam_w_mode, bias_correction, amsgrad,
                maximize, lr_tensor, grad_scale, found_inf):
    args = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, master_params, steps, lr, beta1, beta2, eps,
            weight_decay, adam_w_mode, bias_correction, amsgrad, maximize, lr_tensor, grad_scale, found_inf)
    maxes = max_exp_avg_sqs if amsgrad else []
    if (master_params or not bias_correction or (amsgrad and not maxes)
            or not _fits(params, grads, exp_avgs, exp_avg_sqs, maxes, steps=steps) or not grads or not exp_avgs
            or not exp_avg_sqs):
        return REFERENCE["fused_adam_"](*args)
    kernel = torch._fused_adamw_ if adam_w_mode else torch._fused_adam_
    flag = _flag(found_inf)
    _stepped(steps, flag, lambda: kernel(
        params, grads, exp_avgs, exp_avg_sqs, maxes, steps, lr=_lr(lr, lr_tensor, params[0]), beta1=beta1,
        beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad, maximize=maximize,
        grad_scale=_scale(grad_scale), found_inf=flag))


def fused_adam_compact_(params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes,
                        master_params, steps, exp_avg_map, exp_avg_sq_map, lr, beta1, beta2, eps, weight_decay,
                        adam_w_mode, bias_correction, maximize, lr_tensor, grad_scale, found_inf):
    """Compact state widened to float32 with torch ops (reference/compact_state.py), one
    torch._fused_adam(w)_ call over all of it, narrowed back. Narrowing is not the
    identity on codes (a block's negative maximum comes back as -0.993 of it), so on a
    skipped step (found_inf, read on the device) the old state is kept element by
    element, without a host sync."""
    from .reference.adam_compact import load_moment, load_weights, store_moment, store_weights
    args = (params, grads, exp_avgs, exp_avg_sqs, exp_avg_absmaxes, exp_avg_sq_absmaxes, master_params, steps,
            exp_avg_map, exp_avg_sq_map, lr, beta1, beta2, eps, weight_decay, adam_w_mode, bias_correction,
            maximize, lr_tensor, grad_scale, found_inf)
    if (native.forced_reference() or not params or not bias_correction
            or not all(map(torch.Tensor.is_contiguous, [*params, *grads]))):
        return REFERENCE["fused_adam_compact_"](*args)
    quantized = exp_avgs[0].dtype == torch.uint8
    masters = master_params or [None] * len(params)
    m_max = exp_avg_absmaxes if quantized else [None] * len(params)
    v_max = exp_avg_sq_absmaxes if quantized else [None] * len(params)
    xs = [load_weights(p, m).clone() for p, m in zip(params, masters)]
    ms = [load_moment(m, a, exp_avg_map, p) for m, a, p in zip(exp_avgs, m_max, params)]
    vs = [load_moment(v, a, exp_avg_sq_map, p) for v, a, p in zip(exp_avg_sqs, v_max, params)]
    gs = [g.float() for g in grads]
    flag = _flag(found_inf)
    kernel = torch._fused_adamw_ if adam_w_mode else torch._fused_adam_
    _stepped(steps, flag, lambda: kernel(
        xs, gs, ms, vs, [], steps, lr=_lr(lr, lr_tensor, params[0]), beta1=beta1, beta2=beta2,
        weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=maximize, grad_scale=_scale(grad_scale),
        found_inf=flag))
    if grad_scale is not None:  # torch's kernel wrote the unscaled grads into the float32 copies
        torch._foreach_copy_(grads, [g if flag is None else torch.where(flag > 0, old.float(), g)
                                     for g, old in zip(gs, grads)])
    keep = [] if flag is None else [t.clone() for t in (*params, *exp_avgs, *exp_avg_sqs, *master_params,
                                                          *(exp_avg_absmaxes if quantized else []),
                                                          *(exp_avg_sq_absmaxes if quantized else []))]
    for i, p in enumerate(params):
        store_weights(p, masters[i], xs[i])
        store_moment(exp_avgs[i], m_max[i], exp_avg_map, ms[i])
        store_moment(exp_avg_sqs[i], v_max[i], exp_avg_sq_map, vs[i])
    if keep:
        now = [*params, *exp_avgs, *exp_avg_sqs, *master_params, *(exp_avg_absmaxes if quantized else []),
               *(exp_avg_sq_absmaxes if quantized else [])]
        torch._foreach_copy_(now, [torch.where(flag > 0, old, new) for old, new in zip(keep, now)])


def fused_sgd_(params, grads, momentum_buffers, master_params, lr, momentum, dampening, weight_decay,
               nesterov, wd_after_momentum, first_step, maximize, lr_tensor, grad_scale, found_inf):
    args = (params, grads, momentum_buffers, master_params, lr, momentum, dampening, weight_decay, nesterov,
            wd_after_momentum, first_step, maximize, lr_tensor, grad_scale, found_inf)
    bufs = momentum_buffers if momentum else []
    if (master_params or wd_after_momentum or (nesterov and not momentum) or (momentum and not bufs)
            or not grads or not _fits(params, grads, bufs)):
        return REFERENCE["fused_sgd_"](*args)
    torch._fused_sgd_(params, grads, bufs, weight_decay=weight_decay, momentum=momentum,
                      lr=_lr(lr, lr_tensor, params[0]), dampening=dampening, nesterov=nesterov,
                      maximize=maximize, is_first_step=first_step, grad_scale=_scale(grad_scale),
                      found_inf=_flag(found_inf))


def fused_adagrad_(params, grads, state_sums, master_params, steps, lr, lr_decay, eps, weight_decay,
                   adagrad_w_mode, maximize, lr_tensor, grad_scale, found_inf):
    args = (params, grads, state_sums, master_params, steps, lr, lr_decay, eps, weight_decay, adagrad_w_mode,
            maximize, lr_tensor, grad_scale, found_inf)
    if (master_params or adagrad_w_mode or not grads or not state_sums
            or not _fits(params, grads, state_sums, steps=steps)):
        return REFERENCE["fused_adagrad_"](*args)
    flag = _flag(found_inf)
    _stepped(steps, flag, lambda: torch._fused_adagrad_(
        params, grads, state_sums, steps, lr=_lr(lr, lr_tensor, params[0]), lr_decay=lr_decay,
        weight_decay=weight_decay, eps=eps, maximize=maximize, grad_scale=_scale(grad_scale), found_inf=flag))


def _one_kind(ts, dtypes):
    """``ts`` non-empty, dense and contiguous, of one device and one dtype in ``dtypes``."""
    if not ts or native.forced_reference() or ts[0].dtype not in dtypes:
        return False
    return {(t.dtype, t.device, t.layout) for t in ts} == {(ts[0].dtype, ts[0].device, torch.strided)} and all(
        map(torch.Tensor.is_contiguous, ts))


def _unscalable(ts):
    """Dtypes torch's unscale kernel takes: float16 too, bfloat16 on the CPU only."""
    cpu = bool(ts) and ts[0].device.type == "cpu"
    return _one_kind(ts, (*_PLAIN, torch.float16, *((torch.bfloat16,) if cpu else ())))


def multi_tensor_scale_(src, dst, scale, found_inf):
    """In place (dst is src, as an unscale is), torch's unscale-and-check kernel."""
    in_place = len(src) == len(dst) and all(s is d for s, d in zip(src, dst))
    if not (in_place and _unscalable(src) and found_inf.dtype == torch.float32 and found_inf.numel() == 1
            and scale.numel() == 1 and found_inf.device == scale.device == src[0].device):
        return REFERENCE["multi_tensor_scale_"](src, dst, scale, found_inf)
    check_lists(("src", src), ("dst", dst))
    # torch's kernel sets the flag to 1 where ours ORs into it: the same for a flag of 0 or 1.
    torch._amp_foreach_non_finite_check_and_unscale_(dst, found_inf, scale.to(torch.float32).reshape(()))


def multi_tensor_l2norm(tensors, per_tensor):
    """torch's multi-tensor norm, accumulated in the op's norm dtype (no copies of half
    tensors), then the norm of the norms."""
    if not _one_kind(tensors, (*_PLAIN, torch.float16, torch.bfloat16)):
        return REFERENCE["multi_tensor_l2norm"](tensors, per_tensor)
    dtype = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    norms = torch.stack(torch._foreach_norm(tensors, 2, dtype=dtype))
    total = torch.linalg.vector_norm(norms)
    return total, norms if per_tensor else norms.new_empty(0)


# What backend 3 covers, for ``core_ops info``.
COVERS = {
    "fused_adam_": "torch._fused_adam_ / _fused_adamw_",
    "fused_adam_compact_": "torch._fused_adam_ / _fused_adamw_ on the state widened to float32",
    "fused_sgd_": "torch._fused_sgd_",
    "fused_adagrad_": "torch._fused_adagrad_",
    "multi_tensor_scale_": "torch._amp_foreach_non_finite_check_and_unscale_ (in place)",
    "multi_tensor_l2norm": "torch._foreach_norm",
}
_TORCH_OPS = {"fused_adam_": ("_fused_adam_", "_fused_adamw_"), "fused_sgd_": ("_fused_sgd_",),
              "fused_adam_compact_": ("_fused_adam_", "_fused_adamw_"),
              "fused_adagrad_": ("_fused_adagrad_",),
              "multi_tensor_scale_": ("_amp_foreach_non_finite_check_and_unscale_",),
              "multi_tensor_l2norm": ("_foreach_norm",)}
KERNELS = {name: fn for name, fn in (("fused_adam_", fused_adam_), ("fused_adam_compact_", fused_adam_compact_),
                                     ("fused_sgd_", fused_sgd_),
                                     ("fused_adagrad_", fused_adagrad_), ("multi_tensor_scale_", multi_tensor_scale_),
                                     ("multi_tensor_l2norm", multi_tensor_l2norm))
           if all(_available(t) for t in _TORCH_OPS[name])}
