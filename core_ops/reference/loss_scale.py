"""Reference kernel of the dynamic loss-scale update (Note [Loss-scale update]).

Note [Loss-scale update]: with ``found_inf`` set, the growth tracker resets and the
hysteresis tracker counts down; the scale backs off (never below ``min_scale``) once
the hysteresis tracker reaches zero. Without it, the hysteresis tracker is refilled
and the growth tracker counts up; after ``growth_interval`` clean steps in a row the
scale grows (never above ``max_scale``, and not at all if growing would overflow).
A backed-off scale below float32's smallest normal becomes 0 (then ``min_scale``), as
in Apex, whose kernel flushed denormals (built with --use_fast_math): a denormal
scale would only lose bits. With ``hysteresis=1`` and no bounds (and a scale that
stays normal) this is ATen's ``_amp_update_scale_``. The native
kernels call ``update_scale_math`` in ``csrc/include/core_ops/loss_scale_math.h``.
"""

import torch

from .._validate import check_update_scale_tensors, loss_scale_args


def update_scale_(scale, growth_tracker, hysteresis_tracker, found_inf, growth_factor,
                  backoff_factor, growth_interval, hysteresis, min_scale, max_scale):
    check_update_scale_tensors(scale, growth_tracker, hysteresis_tracker, found_inf)
    loss_scale_args(growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale)
    # Branch-free tensor algebra so the host never waits for the device.
    inf = found_inf.reshape(()) > 0
    # Counted in int64, as loss_scale_math.h: a tracker at an int32 limit must not wrap.
    hyst = torch.where(inf, hysteresis_tracker.to(torch.int64) - 1,
                       torch.full_like(hysteresis_tracker, hysteresis, dtype=torch.int64))
    backed_off = scale * backoff_factor
    backed_off = torch.where(backed_off < torch.finfo(torch.float32).tiny, 0.0, backed_off)
    backed_off = torch.clamp(backed_off, min=min_scale)
    count = growth_tracker.to(torch.int64) + 1
    grow = (~inf) & (count >= growth_interval)
    grown = scale * growth_factor
    grown = torch.where(torch.isfinite(grown), torch.clamp(grown, max=max_scale), scale)
    new_scale = torch.where(inf & (hyst <= 0), backed_off, torch.where(grow, grown, scale))
    new_count = torch.where(inf | grow, torch.zeros_like(growth_tracker), count)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_count)  # < growth_interval <= INT32_MAX: fits
    hysteresis_tracker.copy_(torch.clamp(hyst, min=0))


KERNELS = {
    "update_scale_": update_scale_,
}
