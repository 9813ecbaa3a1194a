"""What every fused optimizer promises as a torch.optim.Optimizer, beyond its numerics:
param groups from generators, copies that step like the original, skipped steps that
change nothing, checks that run before anything changes (Note [Checks before updates]),
Apex checkpoints, and loss scalers that back off when a norm overflows.

Results are compared with torch.equal: the same kernels on the same values."""

import copy
import io
import warnings

import pytest
import torch
from optim_cases import clone_params, make_params

from core_ops import _build
from core_ops.optimizers import (FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb,
                                 FusedNovoGrad, FusedSGD)


@pytest.fixture(autouse=True)
def _native():
    assert _build.ensure("cpu").native


MAKERS = {
    "adam": lambda ps, **kw: FusedAdam(ps, lr=1e-2, weight_decay=0.01, **kw),
    "sgd": lambda ps, **kw: FusedSGD(ps, lr=0.1, momentum=0.9, dampening=0.5, **kw),
    "adagrad": lambda ps, **kw: FusedAdagrad(ps, lr=0.1, **kw),
    "lamb": lambda ps, **kw: FusedLAMB(ps, lr=1e-2, **kw),
    "novograd": lambda ps, **kw: FusedNovoGrad(ps, lr=1e-2, **kw),
    "mp_lamb": lambda ps, **kw: FusedMixedPrecisionLamb(
        ps, lr=1e-2, **{k: v for k, v in kw.items() if k != "master_weights"}),
}
KINDS = list(MAKERS)


def set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def steps(opt, params, seeds, **kw):
    for seed in seeds:
        set_grads(params, seed)
        opt.step(**kw)


def assert_equal(ps, qs):
    for p, q in zip(ps, qs):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize("kind", KINDS)
def test_param_groups_given_as_generators_train(kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    twin = copy.deepcopy(model)
    opt = MAKERS[kind]([{"params": model[0].parameters(), "lr": 0.05}, {"params": model[1].parameters()}])
    opt.add_param_group({"params": model[2].parameters()})
    ref = MAKERS[kind]([{"params": list(twin[0].parameters()), "lr": 0.05}, {"params": list(twin[1].parameters())}])
    ref.add_param_group({"params": list(twin[2].parameters())})
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2, 2]
    before = [p.detach().clone() for p in model.parameters()]
    steps(opt, list(model.parameters()), [1, 2])
    steps(ref, list(twin.parameters()), [1, 2])
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert_equal(model.parameters(), twin.parameters())


def saved_and_loaded(opt):
    buf = io.BytesIO()
    torch.save(opt, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("copier", [copy.deepcopy, saved_and_loaded], ids=["deepcopy", "torch.save"])
def test_a_copy_continues_exactly_as_the_original(kind, copier):
    params = make_params(torch.bfloat16, sizes=(33, 7))
    opt = MAKERS[kind](params, master_weights=True, set_grad_none=False)
    steps(opt, params, [1, 2])
    twin = copier(opt)
    assert (twin.set_grad_none, twin.master_weights, twin.capturable) == (False, True, False)
    twin_params = twin.param_groups[0]["params"]
    steps(opt, params, [3, 4, 5])
    steps(twin, twin_params, [3, 4, 5])
    assert_equal(params, twin_params)
    for p, q in zip(params, twin_params):
        assert torch.equal(opt.state[p]["master_param"], twin.state[q]["master_param"])
    twin.zero_grad()  # set_grad_none=False: zeros, not None
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in twin_params)


UNDAMPED_SGD = lambda ps, **kw: FusedSGD(ps, lr=0.1, momentum=0.9, nesterov=True, **kw)  # noqa: E731


@pytest.mark.parametrize("kind", [*KINDS, "sgd-undamped"])
def test_a_skipped_first_step_leaves_no_trace(kind):
    a = make_params(sizes=(33, 7))
    b = clone_params(a)
    make = UNDAMPED_SGD if kind == "sgd-undamped" else MAKERS[kind]
    oa, ob = make(a), make(b)
    set_grads(b, 0)
    ob.step(found_inf=torch.ones(1))
    assert_equal(a, b)
    for p in b:  # no step counted, no momentum buffer that would read as a step taken:
        # none, or zeros where momentum*0 + g is the first step's buffer (no dampening)
        assert ob.state[p].get("step", torch.zeros(())).item() == 0
        buffer = ob.state[p].get("momentum_buffer")
        assert buffer is None or (not ob.param_groups[0].get("dampening") and not buffer.any())
    steps(oa, a, [1, 2, 3])
    steps(ob, b, [1, 2, 3])
    assert_equal(a, b)


@pytest.mark.parametrize("kind", ["lamb", "novograd"])
@pytest.mark.parametrize("route", ["scaler.step(opt)", "opt.step(grad_scaler=scaler)"])
def test_torch_grad_scaler_backs_off_when_a_norm_overflows(kind, route):
    # Finite grads (3e18, float32 max 3.4e38) whose squared norm overflows float32: the
    # step is skipped, and the scaler must halve its scale as for an inf grad.
    params = [torch.nn.Parameter(torch.ones(64))]
    opt = MAKERS[kind](params)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=1)
    scaler.scale(torch.ones(()))
    for _ in range(3):
        params[0].grad = torch.full((64,), 3e18)
        scaler.step(opt) if route == "scaler.step(opt)" else opt.step(grad_scaler=scaler)
        scaler.update()
    assert scaler.get_scale() == 2.0 ** 13
    assert torch.equal(params[0].detach(), torch.ones(64))
    assert opt.state[params[0]]["step"].item() == 0


@pytest.mark.parametrize("kind", ["adam", "sgd", "novograd"])
def test_a_rejected_state_dict_changes_nothing(kind):
    a = make_params(sizes=(15, 7))
    src = MAKERS[kind](a)
    steps(src, a, [1, 2])
    b = [torch.zeros(20, requires_grad=True), torch.zeros(7, requires_grad=True)]  # another model
    dst = MAKERS[kind](b)
    dst.param_groups[0]["lr"] = 5e-4
    steps(dst, b, [3])
    before = copy.deepcopy(dst.state_dict())
    with pytest.raises(ValueError, match="another model|not from FusedNovoGrad"):
        dst.load_state_dict(src.state_dict())
    after = dst.state_dict()
    assert after["param_groups"] == before["param_groups"] and after["param_groups"][0]["lr"] == 5e-4
    for k, st in before["state"].items():
        assert all(torch.equal(v, after["state"][k][key]) for key, v in st.items())


def test_a_novograd_state_dict_with_per_element_exp_avg_sq_is_rejected_before_loading():
    a = make_params(sizes=(15,))
    src = FusedAdam(a, lr=1.0)  # exp_avg_sq per element, NovoGrad's is one value per tensor
    steps(src, a, [1])
    b = clone_params(a)
    dst = FusedNovoGrad(b, lr=5e-4)
    with pytest.raises(ValueError, match="not from FusedNovoGrad"):
        dst.load_state_dict(src.state_dict())
    assert dst.param_groups[0]["lr"] == 5e-4 and not dst.state


@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_in_a_later_group_is_found_before_any_update(kind):
    w = torch.nn.Parameter(torch.ones(3))
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = MAKERS[kind]([{"params": [w]}, {"params": list(emb.parameters())}])
    w.grad = torch.ones(3)
    emb(torch.tensor([1, 2])).sum().backward()
    # The error says which param: group 1's first, the embedding's (10, 3) weight.
    with pytest.raises(RuntimeError, match=r"sparse gradients: param_groups\[1\]\['params'\]\[0\] \(shape \(10, 3\)"):
        opt.step()
    assert torch.equal(w.detach(), torch.ones(3))
    assert opt.state[w].get("step", torch.zeros(())).item() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_param_whose_data_became_strided_is_found_before_any_update(kind):
    w, v = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(4, 3))
    opt = MAKERS[kind]([{"params": [w]}, {"params": [v]}])
    v.data = torch.ones(4, 6)[:, ::2]
    w.grad, v.grad = torch.ones(3), torch.ones(4, 3)
    with pytest.raises(ValueError, match="dense"):
        opt.step()
    assert torch.equal(w.detach(), torch.ones(3))


@pytest.mark.parametrize("kind", KINDS)
def test_strided_params_are_rejected_when_added(kind):
    strided = torch.zeros(4, 6)[:, ::2].requires_grad_()
    with pytest.raises(ValueError, match=r"param group 0: params\[1\] must be dense.*strides \[6, 2\]"):
        MAKERS[kind]([torch.zeros(3, requires_grad=True), strided])
    opt = MAKERS[kind]([torch.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match=r"param group 1: params\[0\] must be dense"):
        opt.add_param_group({"params": [strided]})
    assert len(opt.param_groups) == 1
    MAKERS[kind]([torch.zeros(3, 4).t().requires_grad_()])  # a permutation is dense: accepted


BAD_GROUPS = [({"lr": -1.0}, "lr must be >= 0"), ({"lr": float("nan")}, "lr must be >= 0"),
              ({"lr": torch.tensor(-1.0)}, "lr must be >= 0"), ({"eps": -1e-8}, "eps must be >= 0"),
              ({"eps": float("nan")}, "eps must be >= 0"), ({"weight_decay": -0.1}, "weight_decay")]
ADAM_LIKE_BAD = [({"betas": (1.5, 0.9)}, r"betas must be in \[0, 1\)"),
                 ({"betas": (0.9, float("nan"))}, r"betas must be in \[0, 1\)"),
                 ({"betas": (0.9, 0.99, 0.9)}, "betas must be a pair")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad,match", BAD_GROUPS + ADAM_LIKE_BAD,
                         ids=lambda x: str(x) if isinstance(x, dict) else "")
def test_group_hyperparameters_are_checked(kind, bad, match):
    p, q = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    if not set(bad) <= set(MAKERS[kind]([p]).defaults):
        # An option this optimizer does not take (SGD: eps, betas) is kept and unused,
        # as in torch.optim: a group copied from an Adam one must still load.
        opt = MAKERS[kind]([{"params": [p]}, {"params": [q], **bad}])
        assert all(opt.param_groups[1][k] is v for k, v in bad.items())
        return
    with pytest.raises(ValueError, match="param group 1: " + match):
        MAKERS[kind]([{"params": [p]}, {"params": [q], **bad}])
    opt = MAKERS[kind]([p])
    with pytest.raises(ValueError, match="param group 1: " + match):
        opt.add_param_group({"params": [q], **bad})
    assert len(opt.param_groups) == 1 and q not in opt.state


@pytest.mark.parametrize("kind", KINDS)
def test_extra_group_keys_are_kept_and_a_likely_typo_is_warned(kind):
    """Keys of the user's or another library's (Lightning's name, timm's lr_scale,
    OneCycleLR's, a torch optimizer's) are kept silently; one typo away from an option
    of this optimizer, a key is warned about (the option stays at its default)."""
    p, q, r = (torch.zeros(n, requires_grad=True) for n in (3, 2, 4))
    opt = MAKERS[kind]([p])
    extra = {"name": "head", "lr_scale": 0.5, "max_lr": 0.1, "base_momentum": 0.85,
             "max_momentum": 0.95, "foreach": None, "decoupled_weight_decay": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.add_param_group({"params": [q], **extra})
    assert all(opt.param_groups[1][k] == v for k, v in extra.items())
    with pytest.warns(UserWarning, match="param group 2: option 'weight_decy'.*did you mean 'weight_decay'"):
        opt.add_param_group({"params": [r], "weight_decy": 0.1})
    assert opt.param_groups[2]["weight_decay"] == opt.defaults["weight_decay"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_param_group_given_as_a_set_is_rejected_as_torch_does(kind):
    with pytest.raises(TypeError, match="ordered collections"):
        MAKERS[kind]([{"params": {torch.zeros(3, requires_grad=True)}}])


@pytest.mark.parametrize("kind", KINDS)
def test_scheduler_keys_and_tensor_lr_are_accepted(kind):
    opt = MAKERS[kind]([torch.zeros(3, requires_grad=True)])
    opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "lr": torch.tensor(0.01),
                         "initial_lr": 0.01})
    assert opt.param_groups[1]["initial_lr"] == 0.01


@pytest.mark.parametrize("kind", KINDS)
def test_grad_scale_and_found_inf_must_be_tensors(kind):
    p = torch.zeros(3, requires_grad=True)
    opt = MAKERS[kind]([p])
    p.grad = torch.ones(3)
    with pytest.raises(TypeError, match="grad_scale must be a one-element tensor.*got float 2.0"):
        opt.step(grad_scale=2.0)
    with pytest.raises(TypeError, match="found_inf must be a one-element tensor.*got bool True"):
        opt.step(found_inf=True)
    assert torch.equal(p.detach(), torch.zeros(3))


@pytest.mark.parametrize("kind", ["adam", "sgd", "adagrad"])
def test_float64_lr_tensor_is_not_rounded_to_float32(kind):
    # torch.optim on float64 params with lr=torch.tensor(0.1, float64) is the reference;
    # rounding the lr to float32 moved results by ~1e-8 relative.
    torch_optim = {"adam": lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.01),
                   "sgd": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9, dampening=0.5),
                   "adagrad": lambda ps, lr: torch.optim.Adagrad(ps, lr=lr)}[kind]
    a = [p.detach().double().requires_grad_() for p in make_params(sizes=(15, 7))]
    b = clone_params(a)
    ours = MAKERS[kind](a)
    for group in ours.param_groups:
        group["lr"] = torch.tensor(0.1, dtype=torch.float64)
    theirs = torch_optim(b, torch.tensor(0.1, dtype=torch.float64))
    for seed in range(5):
        set_grads(a, seed)
        set_grads(b, seed)
        ours.step()
        theirs.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=4e-16 * 8, atol=1e-300)


# Options Apex kept as attributes, so its checkpoints' groups lack them.
APEX_ATTRIBUTE_OPTIONS = {
    "lamb": (lambda ps: FusedLAMB(ps, lr=1e-2, adam_w_mode=False, use_nvlamb=True), ("adam_w_mode", "use_nvlamb")),
    "sgd": (lambda ps: FusedSGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1, wd_after_momentum=True),
            ("wd_after_momentum",)),
    "adagrad": (lambda ps: FusedAdagrad(ps, lr=0.1, weight_decay=0.1, adagrad_w_mode=True), ("adagrad_w_mode",)),
    "novograd": (lambda ps: FusedNovoGrad(ps, lr=1e-2, weight_decay=0.1, reg_inside_moment=True),
                 ("reg_inside_moment",)),
}


@pytest.mark.parametrize("kind", sorted(APEX_ATTRIBUTE_OPTIONS))
def test_checkpoint_groups_without_an_option_take_the_constructors(kind):
    # Apex's FusedLAMB / FusedSGD / FusedAdagrad / FusedNovoGrad kept these options as
    # attributes: its checkpoints' groups lack them. They must come from the
    # constructor (as Apex's did), not from a fixed default, nor raise KeyError.
    make, keys = APEX_ATTRIBUTE_OPTIONS[kind]
    a = make_params(sizes=(15, 7))
    ref = make(a)
    steps(ref, a, range(3))
    sd = copy.deepcopy(ref.state_dict())
    for group in sd["param_groups"]:
        for key in (*keys, "maximize"):
            del group[key]
    b = clone_params(a)
    resumed = make(b)
    resumed.load_state_dict(sd)
    assert all(resumed.param_groups[0][k] == ref.param_groups[0][k] for k in keys)
    steps(ref, a, range(3, 6))
    steps(resumed, b, range(3, 6))
    assert_equal(a, b)


@pytest.mark.parametrize("kind", ["adam", "lamb"])
def test_apex_checkpoint_with_per_group_step_resumes_its_count(kind):
    # Apex's FusedAdam / FusedLAMB keep the step count in param_groups[i]['step'] and no
    # per-param 'step'; bias correction must continue from it, not restart.
    n = 30
    a = make_params(sizes=(15, 7))
    ref = MAKERS[kind](a)
    steps(ref, a, range(n))
    sd = ref.state_dict()
    apex_sd = {"state": {k: {key: v.clone() for key, v in st.items() if key != "step"}
                         for k, st in sd["state"].items()},
               "param_groups": [{**g, "step": n} for g in sd["param_groups"]]}
    b = clone_params(a)
    resumed = MAKERS[kind](b)
    resumed.load_state_dict(apex_sd)
    steps(ref, a, range(n, n + 3))
    steps(resumed, b, range(n, n + 3))
    assert resumed.state[b[0]]["step"].item() == n + 3
    assert_equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_load_hooks_act_as_on_torch_optim(kind):
    """A pre-hook's edits are what is checked and loaded (here: the state of a model
    whose first param grew from 15 to 20 rows, padded by the hook), and a post-hook
    has the last word over the float32 state core_ops restores after torch's loader."""
    a = make_params(sizes=(15, 7))
    src = MAKERS[kind](a)
    steps(src, a, [1, 2])
    b = [torch.zeros(20, requires_grad=True), torch.zeros(7, requires_grad=True)]
    dst = MAKERS[kind](b)

    def grow(optimizer, state_dict):
        def pad(t):
            return torch.cat([t, t.new_zeros(5)]) if t.shape == (15,) else t
        return {**state_dict, "state": {k: {key: pad(v) for key, v in s.items()}
                                        for k, s in state_dict["state"].items()}}

    def reset_second(optimizer):
        state = optimizer.state[b[1]]
        state.update({key: torch.zeros_like(v) for key, v in state.items()})

    dst.register_load_state_dict_pre_hook(grow)
    dst.register_load_state_dict_post_hook(reset_second)
    dst.load_state_dict(src.state_dict())
    saved = src.state_dict()["state"]
    for key, value in saved[0].items():
        if value.shape == (15,):
            assert torch.equal(dst.state[b[0]][key][:15], value) and not dst.state[b[0]][key][15:].any()
    assert sum(v.shape == (15,) for v in saved[0].values()) >= 1
    assert dst.state[b[1]] and not any(v.any() for v in dst.state[b[1]].values())


@pytest.mark.parametrize("kind", KINDS)
def test_writes_to_half_params_between_steps_reach_the_masters(kind):
    """Note [Writes to half params]: a clamp under no_grad and new .data are taken into
    the masters, only where the half values changed; an unwritten param's master keeps
    its extra bits. lr=0 for the step after the writes, so the masters show exactly
    what was taken in."""
    ps = make_params(torch.bfloat16, sizes=(64, 33, 17))
    opt = MAKERS[kind](ps, master_weights=True)
    steps(opt, ps, [1, 2])
    masters = [opt.state[p]["master_param"].clone() for p in ps]
    assert not torch.equal(masters[2], ps[2].detach().float())  # it has bits the half lacks
    with torch.no_grad():
        ps[0].clamp_(-0.5, 0.5)
    ps[1].data = torch.full_like(ps[1], 0.25)
    for group in opt.param_groups:
        group["lr"] = 0.0
    steps(opt, ps, [3])
    clamped = masters[0].to(torch.bfloat16) != ps[0].detach()
    assert clamped.any()
    expected = torch.where(clamped, ps[0].detach().float(), masters[0])
    assert torch.equal(opt.state[ps[0]]["master_param"], expected)
    assert torch.equal(opt.state[ps[1]]["master_param"], torch.full((33,), 0.25))
    assert torch.equal(opt.state[ps[2]]["master_param"], masters[2])
    # An unwritten param is not compared again: its mark still holds after a step.
    assert all(opt._write_marks()[id(p)] == (p._version, p.data_ptr()) for p in ps)


@pytest.mark.parametrize("scaler", ["torch.amp.GradScaler", "LossScaler"])
def test_compiled_scaler_step_with_clipping_matches_eager(scaler):
    """torch.compile of scaler.step(opt) where the step clips by global norm (FusedLAMB's
    default): the overflow report to torch's GradScaler walks the stack (Note
    [Overflowing norms]), which broke the compiled step, so it is skipped when compiling;
    the norm is kept without setting an attribute, which broke it on torch 2.6."""
    from core_ops.amp import LossScaler

    def train(compiled):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = FusedLAMB(model.parameters(), lr=0.01)
        s = (torch.amp.GradScaler("cpu", init_scale=128.0) if scaler.startswith("torch")
             else LossScaler("cpu", init_scale=128.0))

        def step():
            s.step(opt)
            s.update()

        step = torch.compile(step) if compiled else step
        x, y = torch.randn(8, 4), torch.randn(8, 2)
        for _ in range(2):
            opt.zero_grad()
            s.scale(((model(x) - y) ** 2).mean()).backward()
            step()
        return [p.detach() for p in model.parameters()] + [opt.last_grad_norm]

    for a, b in zip(train(True), train(False)):  # the params, then the norm kept
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_between_forward_and_backward_is_caught_by_autograd(kind):
    """The kernels write params in place behind autograd's back; the step moves the
    version counters on as torch's in-place ops do, so a backward through values the
    step changed fails as with torch.optim instead of giving wrong grads."""
    ps = make_params(sizes=(8, 3))
    opt = MAKERS[kind](ps)
    set_grads(ps, 1)
    loss = sum((p * p).sum() for p in ps)  # saves the params for backward
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_compiled_step_with_master_weights_matches_eager():
    """Updates below a bf16 ulp accumulate in the masters under torch.compile too: the
    write check of Note [Writes to half params] stays out of the compiled step (its
    compare, compiled, skipped the rounding and took every param into its master)."""
    def train(compiled):
        p = torch.nn.Parameter(torch.ones(1024, dtype=torch.bfloat16))
        opt = FusedAdam([p], lr=1e-3, master_weights=True)
        step = torch.compile(opt.step) if compiled else opt.step
        for _ in range(12):
            p.grad = torch.ones_like(p)
            step()
        return p.detach(), opt.state[p]["master_param"]

    (p_c, m_c), (p_e, m_e) = train(True), train(False)
    assert p_e.float().mean().item() < 1.0  # the small updates added up to a bf16 step
    assert torch.equal(p_c, p_e)
    torch.testing.assert_close(m_c, m_e, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", ["adam", "novograd"])
def test_a_load_from_inside_a_load_hook_works_as_on_torch_optim(kind):
    """A pre-hook that hands the state dict to a loader which calls load_state_dict
    again: the inner load must not change the hook dicts the outer one is iterating."""
    a = make_params(torch.bfloat16, sizes=(15, 7))
    src = MAKERS[kind](a, master_weights=True)
    steps(src, a, [1, 2])
    dst = MAKERS[kind](clone_params(a), master_weights=True)
    inner = []

    def forward_once(optimizer, state_dict):
        if not inner:
            inner.append(True)
            optimizer.load_state_dict(state_dict)

    dst.register_load_state_dict_pre_hook(forward_once)
    dst.load_state_dict(src.state_dict())
    assert len(dst._optimizer_load_state_dict_pre_hooks) == 1
    assert not dst._optimizer_load_state_dict_post_hooks
    for p, q in zip(src.param_groups[0]["params"], dst.param_groups[0]["params"]):
        assert torch.equal(src.state[p]["master_param"], dst.state[q]["master_param"])
        assert dst.state[q]["exp_avg"].dtype == torch.float32
