"""The loss-scale update: against ATen's _amp_update_scale_ (hysteresis 1, no bounds),
and against a plain-Python model of Note [Loss-scale update] for hysteresis and bounds,
native and reference alike."""

import pytest
import torch

import core_ops
from core_ops.reference import KERNELS as REF

# An overflow pattern with runs long enough to grow (interval 3) and to exhaust hysteresis.
PATTERN = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1]


def state(device, scale=2.0 ** 16, hysteresis=1):
    return (torch.tensor([scale], device=device), torch.zeros(1, dtype=torch.int32, device=device),
            torch.full((1,), hysteresis, dtype=torch.int32, device=device))


def python_model(pattern, scale, interval, hysteresis, min_scale, max_scale, growth=2.0, backoff=0.5):
    tracker, hyst, out = 0, hysteresis, []
    for inf in pattern:
        if inf:
            tracker, hyst = 0, hyst - 1
            if hyst <= 0:
                scale = max(scale * backoff, min_scale)
            hyst = max(hyst, 0)
        else:
            hyst, tracker = hysteresis, tracker + 1
            if tracker >= interval:
                scale, tracker = min(scale * growth, max_scale), 0
        out.append((scale, tracker, hyst))
    return out


def test_matches_aten_amp_update_scale(device):
    ours, theirs = state(device), state(device)
    for inf in PATTERN:
        found = torch.tensor([float(inf)], device=device)
        core_ops.update_scale(ours[0], ours[1], found, growth_interval=3)
        torch._amp_update_scale_(theirs[0], theirs[1], found, 2.0, 0.5, 3)
        assert ours[0].item() == theirs[0].item() and ours[1].item() == theirs[1].item()


@pytest.mark.parametrize("kernel", ["native", "reference"])
@pytest.mark.parametrize("hysteresis,min_scale,max_scale", [(1, 0.0, 2.0 ** 24), (2, 2.0 ** 14, 2.0 ** 17), (3, 1.0, 2.0 ** 16)])
def test_hysteresis_and_bounds(device, kernel, hysteresis, min_scale, max_scale):
    scale, tracker, hyst = state(device, 2.0 ** 15, hysteresis)
    expected = python_model(PATTERN, 2.0 ** 15, 3, hysteresis, min_scale, max_scale)
    for inf, (e_scale, e_tracker, e_hyst) in zip(PATTERN, expected):
        args = (scale, tracker, hyst, torch.tensor([float(inf)], device=device), 2.0, 0.5, 3,
                hysteresis, min_scale, max_scale)
        if kernel == "native":
            torch.ops.core_ops.update_scale_(*args)
        else:
            REF["update_scale_"](*args)
        assert (scale.item(), tracker.item(), hyst.item()) == (e_scale, e_tracker, e_hyst)


def test_growth_that_would_overflow_keeps_scale(device):
    scale, tracker, _ = state(device, 3e38)
    core_ops.update_scale(scale, tracker, torch.zeros(1, device=device), growth_interval=1)
    assert scale.item() == pytest.approx(3e38) and tracker.item() == 0


def test_int32_found_inf_flag(device):
    scale, tracker, _ = state(device)
    core_ops.update_scale(scale, tracker, torch.ones(1, dtype=torch.int32, device=device))
    assert scale.item() == 2.0 ** 15


@pytest.mark.parametrize("kernel", ["native", "reference"])
def test_a_growth_factor_of_one_never_grows_and_still_backs_off(device, kernel):
    """Apex's update_scale_hysteresis takes growth_factor=1.0 (a scale that only backs
    off); the Python model above says what each step leaves."""
    from core_ops.multi_tensor_apply import amp_C
    scale, tracker, hyst = state(device, 2.0 ** 15, 2)
    expected = python_model(PATTERN, 2.0 ** 15, 3, 2, 0.0, float("inf"), growth=1.0)
    for inf, want in zip(PATTERN, expected):
        found = torch.tensor([float(inf)], device=device)
        if kernel == "native":
            amp_C.update_scale_hysteresis(scale, tracker, hyst, found, 1.0, 0.5, 3, 2)
        else:
            REF["update_scale_"](scale, tracker, hyst, found, 1.0, 0.5, 3, 2, 0.0, float("inf"))
        assert (scale.item(), tracker.item(), hyst.item()) == want
    assert scale.item() == 2.0 ** 12  # three back-offs, no growth


@pytest.mark.parametrize("kernel", ["native", "reference"])
def test_a_scale_backed_off_below_the_smallest_normal_becomes_zero(device, kernel):
    """As Apex's kernel (built with fast math, so denormals flush): 2^-126 is float32's
    smallest normal, half of it becomes 0, and min_scale still bounds it from below."""
    for min_scale, want in ((0.0, 0.0), (2.0 ** -130, 2.0 ** -130)):
        scale, tracker, hyst = state(device, 2.0 ** -125)
        for expected in (2.0 ** -126, want):
            args = (scale, tracker, hyst, torch.ones(1, device=device), 2.0, 0.5, 3, 1, min_scale, 1.0)
            (torch.ops.core_ops.update_scale_ if kernel == "native" else REF["update_scale_"])(*args)
            assert scale.item() == expected
