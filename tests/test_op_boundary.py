"""What every multi-tensor and optimizer op refuses, and accepts, whichever kernel runs
it (Note [Op boundary] in core_ops/_boundary.py): aliasing between tensors of one call
(Note [Aliasing]), tensors on another device, and layouts that differ only in the
strides of size-1 dims. Each call runs on three routes: the native CPU kernel
(torch.ops.core_ops), the reference kernel, and the fake kernel (the same call on meta
tensors, with the same views of the same storages). Every case here was once accepted
(or refused) silently: the native result then depended on thread timing (issue 51)."""

import pytest
import torch

import core_ops.compat.apex  # noqa: F401  (installs the alias finder: amp_C)
from core_ops import _build
from core_ops._library import op
from core_ops.reference import KERNELS as REF

ROUTES = ["native", "reference", "meta"]


@pytest.fixture(params=ROUTES)
def route(request):
    if request.param == "native" and not _build.ensure("cpu").native:
        pytest.fail(f"native CPU kernels did not load: {_build.ensure('cpu').reason}")
    return request.param


def call(route, name, *args):
    kernel = REF[name] if route == "reference" else op(name)
    return kernel(*args)


def device_of(route):
    return "meta" if route == "meta" else "cpu"


def flag(route):
    return torch.zeros(1, device=device_of(route))


def one(route):
    return torch.ones(1, device=device_of(route))


def vec(route, n=1000):
    return torch.randn(n, device=device_of(route)) if route != "meta" else torch.empty(n, device="meta")


def adam(route, params, grads, exp_avgs, exp_avg_sqs, steps):
    return call(route, "fused_adam_", params, grads, exp_avgs, exp_avg_sqs, [], [], steps, 1e-3, 0.9, 0.999,
                1e-8, 0.0, True, True, False, False, None, None, None)


def fresh(route, k, n=1000):
    return [vec(route, n) for _ in range(k)]


def steps_of(route, k):
    return [torch.zeros(1, device=device_of(route)) for _ in range(k)]


# ---- aliasing: refused, naming the two arguments ------------------------------------

ALIASED = {
    # An output that is another index's input: its chunks race with that input's.
    "scale_output_is_another_input": (
        lambda r, a, b, c: call(r, "multi_tensor_scale_", [a, b], [b, c], one(r), flag(r)),
        r"dst\[0\] shares memory with src\[1\]: the op reads one while it writes the other"),
    "scale_one_tensor_everywhere": (
        lambda r, a, b, c: call(r, "multi_tensor_scale_", [a, a], [a, a], one(r), flag(r)),
        r"dst\[0\] and dst\[1\] share memory, and the op writes both"),
    "scale_flag_inside_an_output": (
        lambda r, a, b, c: call(r, "multi_tensor_scale_", [a[:500]], [b[:500]], one(r), b[499:500]),
        r"dst\[0\] and found_inf share memory, and the op writes both"),
    "axpby_output_is_another_y": (
        lambda r, a, b, c: call(r, "multi_tensor_axpby_", [a[:10], a[10:20]], [a[20:30], b[:10]], [b[:10], a[30:40]], 1.0, 1.0,
                                flag(r), -1),
        r"out\[0\] shares memory with y\[1\]"),
    "unscale_one_tensor_twice": (
        lambda r, a, b, c: call(r, "multi_tensor_unscale_l2norm_", [a, a], one(r) * 0.5, flag(r), False),
        r"tensors\[0\] and tensors\[1\] share memory, and the op writes both"),
    "check_finite_flag_inside_a_tensor": (
        lambda r, a, b, c: call(r, "multi_tensor_check_finite_", [a], a[3:4]),
        r"found_inf shares memory with tensors\[0\]"),
    "adam_exp_avg_is_exp_avg_sq": (
        lambda r, a, b, c: adam(r, [a], [b], [c], [c], steps_of(r, 1)),
        r"exp_avgs\[0\] and exp_avg_sqs\[0\] share memory, and the op writes both"),
    "adam_one_param_twice": (
        lambda r, a, b, c: adam(r, [a, a], fresh(r, 2), fresh(r, 2), fresh(r, 2), steps_of(r, 2)),
        r"params\[0\] and params\[1\] share memory, and the op writes both"),
    "adam_overlapping_views": (
        lambda r, a, b, c: adam(r, [a[:600], a[400:]], [b[:600], c[:600]], fresh(r, 2, 600),
                                fresh(r, 2, 600), steps_of(r, 2)),
        r"params\[0\] and params\[1\] share memory, and the op writes both"),
    "adam_grad_is_its_param": (
        lambda r, a, b, c: adam(r, [a], [a], [b], [c], steps_of(r, 1)),
        r"params\[0\] and grads\[0\] share memory, and the op writes both"),
    "adam_one_step_for_two_params": (
        lambda r, a, b, c: adam(r, [a, b], fresh(r, 2), fresh(r, 2), fresh(r, 2), [c[:1], c[:1]]),
        r"steps\[0\] and steps\[1\] share memory, and the op writes both"),
    "adam_grad_scale_inside_a_moment": (
        lambda r, a, b, c: call(r, "fused_adam_", [a], [b], [c], [vec(r)], [], [], steps_of(r, 1), 1e-3, 0.9,
                                0.999, 1e-8, 0.0, True, True, False, False, None, c[7:8], None),
        r"exp_avgs\[0\] shares memory with grad_scale"),
    "lamb_stage2_update_is_its_param": (
        lambda r, a, b, c: call(r, "fused_lamb_stage2_", [a], [], [a], one(r), one(r), 1e-3, 0.0, False, None,
                                None),
        r"params\[0\] shares memory with updates\[0\]"),
    "update_scale_trackers_one_tensor": (
        lambda r, a, b, c: (lambda t: call(r, "update_scale_", one(r), t, t, flag(r), 2.0, 0.5, 10, 1, 0.0,
                                           1e9))(torch.zeros(1, dtype=torch.int32, device=device_of(r))),
        r"growth_tracker and hysteresis_tracker share memory, and the op writes both"),
    "scale_expanded_output": (
        lambda r, a, b, c: call(r, "multi_tensor_scale_", [a], [flag(r).expand(1000)], one(r), flag(r)),
        r"dst\[0\] has elements that share memory \(a stride of 0"),
}


@pytest.mark.parametrize("case", sorted(ALIASED))
def test_aliased_tensors_are_refused_naming_both(route, case):
    fn, message = ALIASED[case]
    a, b, c = fresh(route, 3)
    before = [t.clone() for t in (a, b, c)] if route != "meta" else []
    with pytest.raises(ValueError, match=message):
        fn(route, a, b, c)
    for t, old in zip((a, b, c), before):
        assert torch.equal(t, old)  # refused before any write


# ---- what stays legal ---------------------------------------------------------------

def test_in_place_and_disjoint_views_and_shared_inputs_are_accepted(route):
    a, b = fresh(route, 2)
    call(route, "multi_tensor_scale_", [a], [a], one(route), flag(route))  # in place
    call(route, "multi_tensor_scale_", [a[:500]], [a[500:]], one(route), flag(route))  # disjoint views
    call(route, "multi_tensor_scale_", [b, b], fresh(route, 2), one(route), flag(route))  # one input, read twice
    call(route, "multi_tensor_axpby_", [a], [a], [a], 2.0, -1.0, flag(route), -1)  # x, y and out one tensor
    call(route, "multi_tensor_check_finite_", [b, b[:10]], flag(route))  # reads only
    w = fresh(route, 1, 2000)[0]
    adam(route, [w[:1000], w[1000:]], fresh(route, 2), fresh(route, 2), fresh(route, 2), steps_of(route, 2))


def test_in_place_scale_gives_the_values():
    a = torch.arange(10.0)
    op("multi_tensor_scale_")([a[:5]], [a[5:]], torch.full((1,), 2.0), torch.zeros(1))
    assert torch.equal(a, torch.tensor([0.0, 1, 2, 3, 4, 0, 2, 4, 6, 8]))


# ---- one device ---------------------------------------------------------------------

META_AMONG_CPU = {
    "scale_meta_flag": (lambda: op("multi_tensor_scale_")([torch.randn(4)], [torch.empty(4)], torch.ones(1),
                                                            torch.zeros(1, device="meta")),
                        "found_inf is on meta but the op runs on cpu"),
    "scale_meta_scale": (lambda: op("multi_tensor_scale_")([torch.randn(4)], [torch.empty(4)],
                                                             torch.ones(1, device="meta"), torch.zeros(1)),
                         "scale is on meta but the op runs on cpu"),
    "check_finite_nan_with_meta_flag": (lambda: op("multi_tensor_check_finite_")(
        [torch.tensor([float("nan")])], torch.zeros(1, device="meta")), "found_inf is on meta but the op runs on cpu"),
    "adam_meta_lr": (lambda: op("fused_adam_")(
        [torch.randn(4)], [torch.randn(4)], [torch.zeros(4)], [torch.zeros(4)], [], [], [torch.zeros(1)], 0.0, 0.9,
        0.999, 1e-8, 0.0, True, True, False, False, torch.ones(1, device="meta"), None, None),
        "lr_tensor is on meta but the op runs on cpu"),
    "adam_meta_step": (lambda: op("fused_adam_")(
        [torch.randn(4)], [torch.randn(4)], [torch.zeros(4)], [torch.zeros(4)], [], [],
        [torch.zeros(1, device="meta")], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, False, False, None, None, None),
        r"steps\[0\] is on meta but the op runs on cpu"),
    "update_scale_meta_flag": (lambda: op("update_scale_")(
        torch.ones(1), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
        torch.zeros(1, device="meta"), 2.0, 0.5, 10, 1, 0.0, 1e9), "found_inf is on meta but the op runs on cpu"),
}


@pytest.mark.parametrize("case", sorted(META_AMONG_CPU))
def test_a_meta_tensor_among_cpu_tensors_is_an_error(case):
    # Dispatch sends such a call to the fake kernel, which once returned having done nothing.
    fn, message = META_AMONG_CPU[case]
    with pytest.raises(ValueError, match=message):
        fn()


# ---- size-1 dims' strides -----------------------------------------------------------

def test_state_whose_size_one_dim_has_another_stride_is_accepted(route):
    if route == "meta":
        pytest.skip("the values are the point: meta tensors have none")
    param = torch.randn(17, 1).t()  # contiguous, strides (1, 1)
    assert param.is_contiguous() and param.stride() != torch.zeros(1, 17).stride()
    grad = torch.randn(1, 17)
    got, want = param.clone(), param.contiguous().clone()  # clone keeps the (1, 1) strides
    assert got.stride() == (1, 1)
    m, v = torch.zeros(1, 17), torch.zeros(1, 17)
    adam(route, [got], [grad.clone()], [m], [v], [torch.zeros(1)])
    adam(route, [want], [grad.clone()], [torch.zeros(1, 17)], [torch.zeros(1, 17)], [torch.zeros(1)])
    assert torch.equal(got, want) and m.abs().sum() > 0


def test_amp_c_adam_takes_a_param_whose_size_one_dim_has_another_stride():
    import amp_C
    from apex.multi_tensor_apply import multi_tensor_applier
    param, grad = torch.randn(17, 1).t().clone(), torch.randn(1, 17)
    want = param.contiguous().clone()
    m, v = torch.zeros(1, 17), torch.zeros(1, 17)
    noop = torch.zeros(1, dtype=torch.int32)
    multi_tensor_applier(amp_C.multi_tensor_adam, noop, [[grad], [param], [m], [v]], 0.1, 0.9, 0.999, 1e-8, 1, 1,
                         1, 0.0)
    multi_tensor_applier(amp_C.multi_tensor_adam, noop, [[grad], [want], [torch.zeros(1, 17)], [torch.zeros(1, 17)]],
                         0.1, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    assert torch.equal(param, want) and not torch.equal(param, torch.zeros(1, 17))
