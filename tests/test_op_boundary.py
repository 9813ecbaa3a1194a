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
from core_ops import native
from core_ops._schemas import op
from core_ops.reference import KERNELS as REF

ROUTES = ["native", "reference", "meta"]


@pytest.fixture(params=ROUTES)
def route(request):
    if request.param == "native" and not native.ensure("cpu").native:
        pytest.fail(f"native CPU kernels did not load: {native.ensure('cpu').reason}")
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


# ---- settings and scalars the ops once took without a word ---------------------------

def update_scale(route, growth_tracker=0, hysteresis_tracker=1, **settings):
    kw = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=10, hysteresis=1, min_scale=0.0,
              max_scale=1e9)
    kw.update(settings)
    dev = device_of(route)
    scale = torch.full((1,), 8.0, device=dev)
    trackers = (torch.full((1,), growth_tracker, dtype=torch.int32, device=dev),
                torch.full((1,), hysteresis_tracker, dtype=torch.int32, device=dev))
    call(route, "update_scale_", scale, *trackers, torch.zeros(1, device=dev), *kw.values())
    return scale, trackers


@pytest.mark.parametrize("settings, message", [
    (dict(growth_interval=0), r"growth_interval and hysteresis must be in \[1, 2\*\*31 - 1\].*got 0 and 1"),
    (dict(hysteresis=-1), r"growth_interval and hysteresis must be in \[1, 2\*\*31 - 1\].*got 10 and -1"),
    (dict(hysteresis=2**40), r"growth_interval and hysteresis must be in .*got 10 and 1099511627776"),
    (dict(max_scale=float("nan")), r"need 0 <= min_scale <= max_scale, got 0 and nan"),
    (dict(backoff_factor=1.5), r"backoff_factor must be in \(0, 1\), got 1.5"),
], ids=["growth_interval_0", "negative_hysteresis", "hysteresis_past_int32", "nan_max_scale", "backoff_1.5"])
def test_update_scale_refuses_settings_its_trackers_cannot_hold(route, settings, message):
    with pytest.raises(ValueError, match=message):
        update_scale(route, **settings)


def test_public_update_scale_refuses_a_hysteresis_int32_cannot_hold():
    # It once stored 2**40 truncated to int32: 0, so the next overflow backed off at once.
    import core_ops
    t = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"2\*\*31 - 1"):
        core_ops.update_scale(torch.ones(1), torch.zeros(1, dtype=torch.int32), torch.zeros(1),
                              hysteresis=2**40, hysteresis_tracker=t)


@pytest.mark.parametrize("route", ["native", "reference"])
def test_a_growth_tracker_at_int32_max_grows_the_scale_without_overflow(route):
    # The native kernel added 1 in int32 there (undefined behaviour; UBSan's report).
    if route == "native":
        assert native.ensure("cpu").native
    top = 2**31 - 1
    scale, (growth, hysteresis) = update_scale(route, growth_tracker=top, growth_interval=top)
    assert scale.item() == 16.0 and growth.item() == 0 and hysteresis.item() == 1
    scale, (growth, hysteresis) = update_scale(route, growth_tracker=top - 2, growth_interval=top)
    assert scale.item() == 8.0 and growth.item() == top - 1


def test_amp_c_noop_flag_of_two_elements_is_refused_by_every_function():
    # multi_tensor_l2norm once set both elements; multi_tensor_scale refused the flag.
    import amp_C
    t, noop = [torch.randn(8)], torch.zeros(2, dtype=torch.int32)
    for fn, args in ((amp_C.multi_tensor_l2norm, ([t],)), (amp_C.multi_tensor_scale, ([t, t], 1.0)),
                     (amp_C.multi_tensor_unscale_l2norm, ([t], torch.ones(1)))):
        with pytest.raises(ValueError, match=r"noop_flag must be a one-element float32 or int32 tensor"):
            fn(2048, noop, *args)
    assert noop.tolist() == [0, 0]


@pytest.mark.parametrize("value", [0.0, float("nan"), -1.0, float("inf")])
@pytest.mark.parametrize("name", ["fused_adam_", "fused_novograd_"])
def test_a_grad_scale_on_the_host_must_be_finite_and_positive(value, name):
    # Grads divided by it would turn the params into nan (the reference once raised
    # ZeroDivisionError for NovoGrad's 0, the native kernel wrote nan).
    assert native.ensure("cpu").native
    for kernel in (op(name), REF[name]):
        p = torch.randn(4)
        before = p.clone()
        args = {"fused_adam_": ([p], [torch.randn(4)], [torch.zeros(4)], [torch.zeros(4)], [], [], [torch.zeros(1)],
                                1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, False, False),
                "fused_novograd_": ([p], [torch.randn(4)], [torch.zeros(4)], [torch.zeros(1)], [], [torch.zeros(1)],
                                    torch.ones(1), 2, 1e-3, 0.9, 0.99, 1e-8, 0.0, True, False, True, False,
                                    False)}[name]
        with pytest.raises(ValueError, match=rf"grad_scale must be finite and > 0, got {value:g}"):
            kernel(*args, None, torch.full((1,), value), None)
        assert torch.equal(p, before)


@pytest.mark.parametrize("route", ["native", "reference"])
def test_an_8bit_map_holding_nan_or_out_of_order_is_refused(route):
    from core_ops.reference.compact_state import dynamic_map
    if route == "native":
        assert native.ensure("cpu").native
    kernel = op("fused_adam_compact_") if route == "native" else REF["fused_adam_compact_"]
    signed, unsigned = dynamic_map(True), dynamic_map(False)
    for bad, message in ((signed.clone().index_fill_(0, torch.tensor([5]), float("nan")), "value 5 is nan"),
                         (signed.flip(0).contiguous(), "value 1 is .* after 1")):
        p = torch.randn(300)
        with pytest.raises(ValueError, match=rf"exp_avg_map must hold finite values in ascending order; {message}"):
            kernel([p], [torch.randn(300)], [torch.zeros(300, dtype=torch.uint8)],
                   [torch.zeros(300, dtype=torch.uint8)], [torch.zeros(2)], [torch.zeros(2)], [], [torch.zeros(1)],
                   bad, unsigned, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, False, None, None, None)


def test_a_scale_that_is_not_a_number_is_refused_naming_it(route):
    # The CPU kernel said "expected a floating or integer scalar tensor" without the
    # argument's name, the CUDA kernel converted a uint8 scale, the reference took it.
    d = device_of(route)
    with pytest.raises(TypeError, match="^scale must be a floating or integer tensor, got torch.uint8$"):
        call(route, "multi_tensor_scale_", [torch.ones(3, device=d)], [torch.zeros(3, device=d)],
             torch.ones(1, dtype=torch.uint8, device=d), flag(route))
    with pytest.raises(TypeError, match="^inv_scale must be a floating or integer tensor, got torch.bool$"):
        call(route, "multi_tensor_unscale_l2norm_", [torch.ones(3, device=d)], torch.ones(1, dtype=torch.bool, device=d),
             flag(route), False)


@pytest.mark.parametrize("route", ["native", "reference"])
def test_sync_batch_norm_refuses_float8_weights(route):
    if route == "native":
        assert native.ensure("cpu").native
    kernel = op("sync_batch_norm_elemt") if route == "native" else REF["sync_batch_norm_elemt"]
    x = torch.randn(4, 3, 5)
    weight = torch.ones(3).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"weight must be a \(3,\) float tensor on cpu, got \(3,\) torch.float8"):
        kernel(x, torch.zeros(3), torch.ones(3), weight, None)


# ---- in-place writes into tensors that require grad ----------------------------------

def test_public_ops_refuse_to_write_a_tensor_that_requires_grad_under_grad_mode():
    import core_ops
    leaf = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"dst\[0\] requires grad, and multi_tensor_scale writes it in place"):
        core_ops.multi_tensor_scale([torch.ones(4)], [leaf], 2.0)
    with pytest.raises(RuntimeError, match=r"out\[0\] requires grad"):
        core_ops.multi_tensor_axpby([torch.ones(4)], [torch.ones(4)], [leaf * 1], 1.0, 1.0)
    with pytest.raises(RuntimeError, match=r"tensors\[0\] requires grad"):
        core_ops.multi_tensor_unscale_l2norm([leaf], 0.5)
    assert torch.equal(leaf.detach(), torch.ones(4))
    with torch.no_grad():  # as optimizers step
        core_ops.multi_tensor_scale([torch.ones(4)], [leaf], 2.0)
    assert torch.equal(leaf.detach(), torch.full((4,), 2.0))


@pytest.mark.parametrize("route", ["reference", "meta"])
def test_raw_ops_on_python_kernels_refuse_a_written_tensor_that_requires_grad(route):
    p = vec(route, 8).requires_grad_()
    with pytest.raises(RuntimeError, match=r"params\[0\] requires grad, and fused_adam_ writes it in place"):
        adam(route, [p], fresh(route, 1, 8), fresh(route, 1, 8), fresh(route, 1, 8), steps_of(route, 1))
    with torch.no_grad():
        adam(route, [p], fresh(route, 1, 8), fresh(route, 1, 8), fresh(route, 1, 8), steps_of(route, 1))


# Note [Declared checks]: a check declared once beside the schema refuses on every route
# with one message (these two were once in the C++ kernels alone, or in their entry
# points and the reference kernels with the fake kernels checking after the lists).
def test_declared_scalar_checks_refuse_on_every_route(route):
    ps, gs, bufs = fresh(route, 2), fresh(route, 2), fresh(route, 2)
    with pytest.raises(ValueError, match=r"^nesterov needs momentum > 0$"):
        call(route, "fused_sgd_", ps, gs, bufs, [], 0.1, 0.0, 0.0, 0.0, True, False, False, False, None, None, None)
    norms = torch.ones(2, device=device_of(route))
    with pytest.raises(ValueError, match=r"^norm_type must be 2 \(L2\) or 0 \(infinity norm\), got 1$"):
        call(route, "fused_novograd_", [], [], [], [], [], [], norms, 1, 0.1, 0.9, 0.99, 1e-8, 0.0, True, False,
             True, False, False, None, None, None)
    # an optional list given without its flag is checked all the same
    with pytest.raises(ValueError, match=r"^max_exp_avg_sqs has 1 tensors but params has 2$"):
        call(route, "fused_adam_", ps, gs, fresh(route, 2), fresh(route, 2), fresh(route, 1), [], steps_of(route, 2),
             1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, False, False, None, None, None)


def test_the_generated_entry_points_are_current():
    """csrc/include/core_ops/optimizer_ops.h is what native/entries.py writes from the
    declarations (run `python -m core_ops.native.entries` after changing one)."""
    from core_ops.native import entries
    assert entries.HEADER.read_text() == entries.render()


def test_a_required_state_list_left_empty_is_refused_on_every_route(route):
    with pytest.raises(ValueError, match=r"^state_sums has 0 tensors but params has 2$"):
        call(route, "fused_adagrad_", fresh(route, 2), fresh(route, 2), [], [], steps_of(route, 2), 0.01, 0.0,
             1e-10, 0.0, False, False, None, None, None)


def test_a_float64_list_beside_an_integer_one_names_the_integer_dtype(route):
    src = [vec(route).double()]
    dst = [torch.zeros(1000, dtype=torch.uint8, device=device_of(route))]
    with pytest.raises(TypeError, match=r"^dst: expected float32, float16, bfloat16 or float64 tensors, got "
                                        r"torch.uint8$"):
        call(route, "multi_tensor_scale_", src, dst, one(route), flag(route))


@pytest.mark.parametrize("name", ["layer_norm_bwd", "rms_norm_bwd"])
def test_a_norm_backward_over_no_rows_makes_nothing_of_hidden_values(route, name):
    """No rows: any hidden fits, and nothing of `hidden` values is made (2**40 float64
    values were once asked of the CPU allocator)."""
    d, hidden = device_of(route), 2**40
    empty = torch.empty(0, 16, dtype=torch.float64, device=d)
    stats = [torch.empty(0, dtype=torch.float64, device=d)] * (2 if name == "layer_norm_bwd" else 1)
    params = [None, None] if name == "layer_norm_bwd" else [None]
    dx, *grads = call(route, name, empty, empty.clone(), *stats, *params, hidden, False, torch.float64)
    assert dx.shape == (0, 16) and all(g.shape == (0,) for g in grads)
