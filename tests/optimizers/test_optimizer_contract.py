"""What every fused optimizer promises as a torch.optim.Optimizer, beyond its numerics:
param groups from generators, copies that step like the original, skipped steps that
change nothing, checks that run before anything changes (Note [Checks before updates]),
Apex checkpoints, and loss scalers that back off when a norm overflows. The optimizers
come from the registry (optimizer_registry.py, generic test "contract").

Tests that step run on each device; checks made when a group is added, before any
tensor is read, run once. Results are compared with torch.equal: the same kernels on
the same values. The float64 lr is compared with torch.optim on the CPU only, where
torch rounds as our kernels do."""

import copy
import io
import warnings

import pytest
import torch
from optim_cases import DEVICES, clone_params, make_params, native_kernels, ulps_close  # noqa: F401  (autouse)
from optimizer_registry import cases

CONTRACT = cases("contract")


def set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.device, p.dtype)


def steps(opt, params, seeds, **kw):
    for seed in seeds:
        set_grads(params, seed)
        opt.step(**kw)


def assert_equal(ps, qs):
    for p, q in zip(ps, qs):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_param_groups_given_as_generators_train(device, info):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2)).to(device)
    twin = copy.deepcopy(model)
    opt = info.make([{"params": model[0].parameters(), "lr": 0.05}, {"params": model[1].parameters()}])
    opt.add_param_group({"params": model[2].parameters()})
    ref = info.make([{"params": list(twin[0].parameters()), "lr": 0.05}, {"params": list(twin[1].parameters())}])
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


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("copier", [copy.deepcopy, saved_and_loaded], ids=["deepcopy", "torch.save"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_copy_continues_exactly_as_the_original(device, copier, info):
    params = make_params(torch.bfloat16, sizes=(33, 7), device=device)
    opt = info.make(params, master_weights=True, set_grad_none=False)
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


@pytest.mark.parametrize("info,config", cases("contract", variants=True))
@pytest.mark.parametrize("device", DEVICES)
def test_a_skipped_first_step_leaves_no_trace(device, info, config):
    """Every variant: SGD's undamped ones leave a zero buffer (momentum*0 + g is the
    first step's buffer), its damped ones none."""
    a = make_params(sizes=(33, 7), device=device)
    b = clone_params(a)
    oa, ob = info.make(a, config), info.make(b, config)
    set_grads(b, 0)
    ob.step(found_inf=torch.ones(1, device=device))
    assert_equal(a, b)
    for p in b:  # no step counted, no momentum buffer that would read as a step taken:
        # none, or zeros where momentum*0 + g is the first step's buffer (no dampening)
        assert ob.state[p].get("step", torch.zeros(())).item() == 0
        buffer = ob.state[p].get("momentum_buffer")
        assert buffer is None or (not ob.param_groups[0].get("dampening") and not buffer.any())
    steps(oa, a, [1, 2, 3])
    steps(ob, b, [1, 2, 3])
    assert_equal(a, b)


@pytest.mark.parametrize("info", cases("contract", "norm_overflow"))
@pytest.mark.parametrize("route", ["scaler.step(opt)", "opt.step(grad_scaler=scaler)"])
@pytest.mark.parametrize("device", DEVICES)
def test_torch_grad_scaler_backs_off_when_a_norm_overflows(device, route, info):
    # Finite grads (3e18, float32 max 3.4e38) whose squared norm overflows float32: the
    # step is skipped, and the scaler must halve its scale as for an inf grad.
    params = [torch.nn.Parameter(torch.ones(64, device=device))]
    opt = info.make(params)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16, growth_interval=1)
    scaler.scale(torch.ones((), device=device))
    for _ in range(3):
        params[0].grad = torch.full((64,), 3e18, device=device)
        scaler.step(opt) if route == "scaler.step(opt)" else opt.step(grad_scaler=scaler)
        scaler.update()
    assert scaler.get_scale() == 2.0 ** 13
    assert torch.equal(params[0].detach().cpu(), torch.ones(64))
    assert opt.state[params[0]]["step"].item() == 0


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_a_rejected_state_dict_changes_nothing(device, info):
    a = make_params(sizes=(15, 7), device=device)
    src = info.make(a)
    steps(src, a, [1, 2])
    b = [torch.zeros(20, device=device, requires_grad=True), torch.zeros(7, device=device, requires_grad=True)]
    dst = info.make(b)  # of another model
    dst.param_groups[0]["lr"] = 5e-4
    steps(dst, b, [3])
    before = copy.deepcopy(dst.state_dict())
    with pytest.raises(ValueError, match="another model|not from FusedNovoGrad"):
        dst.load_state_dict(src.state_dict())
    after = dst.state_dict()
    assert after["param_groups"] == before["param_groups"] and after["param_groups"][0]["lr"] == 5e-4
    for k, st in before["state"].items():
        assert all(torch.equal(v, after["state"][k][key]) for key, v in st.items())


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_in_a_later_group_is_found_before_any_update(device, info):
    w = torch.nn.Parameter(torch.ones(3, device=device))
    emb = torch.nn.Embedding(10, 3, sparse=True, device=device)
    opt = info.make([{"params": [w]}, {"params": list(emb.parameters())}])
    w.grad = torch.ones(3, device=device)
    emb(torch.tensor([1, 2], device=device)).sum().backward()
    # The error says which param: group 1's first, the embedding's (10, 3) weight. It is
    # a TypeError, as the ops' refusal of a sparse tensor, and a RuntimeError, as
    # torch.optim's and Apex's.
    with pytest.raises(RuntimeError, match=r"sparse gradients: param_groups\[1\]\['params'\]\[0\] \(shape \(10, 3\)") as e:
        opt.step()
    assert isinstance(e.value, TypeError)
    assert torch.equal(w.detach().cpu(), torch.ones(3))
    assert opt.state[w].get("step", torch.zeros(())).item() == 0


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_a_param_whose_data_became_strided_is_found_before_any_update(device, info):
    w, v = torch.nn.Parameter(torch.ones(3, device=device)), torch.nn.Parameter(torch.ones(4, 3, device=device))
    opt = info.make([{"params": [w]}, {"params": [v]}])
    v.data = torch.ones(4, 6, device=device)[:, ::2]
    w.grad, v.grad = torch.ones(3, device=device), torch.ones(4, 3, device=device)
    with pytest.raises(ValueError, match="dense"):
        opt.step()
    assert torch.equal(w.detach().cpu(), torch.ones(3))


@pytest.mark.parametrize("info", CONTRACT)
def test_strided_params_are_rejected_when_added(info):
    strided = torch.zeros(4, 6)[:, ::2].requires_grad_()
    with pytest.raises(ValueError, match=r"param group 0: params\[1\] must be dense.*strides \[6, 2\]"):
        info.make([torch.zeros(3, requires_grad=True), strided])
    opt = info.make([torch.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match=r"param group 1: params\[0\] must be dense"):
        opt.add_param_group({"params": [strided]})
    assert len(opt.param_groups) == 1
    info.make([torch.zeros(3, 4).t().requires_grad_()])  # a permutation is dense: accepted


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("name", ["grad_scale", "found_inf"])
def test_a_meta_scale_or_flag_is_refused_before_any_update(info, name):
    # It holds no value to move to the params' device: torch said "Cannot copy out of
    # meta tensor" from inside the step.
    params = [torch.ones(3, requires_grad=True)]
    opt = info.make(params)
    params[0].grad = torch.ones(3)
    with pytest.raises(ValueError, match=f"step\\(\\): {name} is a meta tensor, which holds no value"):
        opt.step(**{name: torch.ones(1, device="meta")})
    assert torch.equal(params[0].detach(), torch.ones(3))


BAD_GROUPS = [({"lr": -1.0}, "lr must be >= 0"), ({"lr": float("nan")}, "lr must be >= 0"),
              ({"lr": torch.tensor(-1.0)}, "lr must be >= 0"),
              ({"lr": torch.tensor(0.1, device="meta")}, "lr is a meta tensor, which holds no value"), ({"eps": -1e-8}, "eps must be >= 0"),
              ({"eps": float("nan")}, "eps must be >= 0"), ({"weight_decay": -0.1}, "weight_decay")]
ADAM_LIKE_BAD = [({"betas": (1.5, 0.9)}, r"betas must be in \[0, 1\)"),
                 ({"betas": (0.9, float("nan"))}, r"betas must be in \[0, 1\)"),
                 ({"betas": (0.9, 0.99, 0.9)}, "betas must be a pair")]


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("bad,match", BAD_GROUPS + ADAM_LIKE_BAD,
                         ids=lambda x: str(x) if isinstance(x, dict) else "")
def test_group_hyperparameters_are_checked(info, bad, match):
    p, q = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    if not set(bad) <= set(info.make([p]).defaults):
        # An option this optimizer does not take (SGD: eps, betas) is kept and unused,
        # as in torch.optim: a group copied from an Adam one must still load.
        opt = info.make([{"params": [p]}, {"params": [q], **bad}])
        assert all(opt.param_groups[1][k] is v for k, v in bad.items())
        return
    with pytest.raises(ValueError, match="param group 1: " + match):
        info.make([{"params": [p]}, {"params": [q], **bad}])
    opt = info.make([p])
    with pytest.raises(ValueError, match="param group 1: " + match):
        opt.add_param_group({"params": [q], **bad})
    assert len(opt.param_groups) == 1 and q not in opt.state


@pytest.mark.parametrize("info", CONTRACT)
def test_extra_group_keys_are_kept_and_a_likely_typo_is_warned(info):
    """Keys of the user's or another library's (Lightning's name, timm's lr_scale,
    OneCycleLR's, a torch optimizer's) are kept silently; one typo away from an option
    of this optimizer, a key is warned about (the option stays at its default)."""
    p, q, r = (torch.zeros(n, requires_grad=True) for n in (3, 2, 4))
    opt = info.make([p])
    extra = {"name": "head", "lr_scale": 0.5, "max_lr": 0.1, "base_momentum": 0.85,
             "max_momentum": 0.95, "foreach": None, "decoupled_weight_decay": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.add_param_group({"params": [q], **extra})
    assert all(opt.param_groups[1][k] == v for k, v in extra.items())
    with pytest.warns(UserWarning, match="param group 2: option 'weight_decy'.*did you mean 'weight_decay'"):
        opt.add_param_group({"params": [r], "weight_decy": 0.1})
    assert opt.param_groups[2]["weight_decay"] == opt.defaults["weight_decay"]


@pytest.mark.parametrize("info", CONTRACT)
def test_a_param_group_given_as_a_set_is_rejected_as_torch_does(info):
    with pytest.raises(TypeError, match="ordered collections"):
        info.make([{"params": {torch.zeros(3, requires_grad=True)}}])


@pytest.mark.parametrize("info", CONTRACT)
def test_scheduler_keys_and_tensor_lr_are_accepted(info):
    opt = info.make([torch.zeros(3, requires_grad=True)])
    opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "lr": torch.tensor(0.01),
                         "initial_lr": 0.01})
    assert opt.param_groups[1]["initial_lr"] == 0.01


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_grad_scale_and_found_inf_must_be_tensors(device, info):
    p = torch.zeros(3, device=device, requires_grad=True)
    opt = info.make([p])
    p.grad = torch.ones(3, device=device)
    with pytest.raises(TypeError, match="grad_scale must be a one-element tensor.*got float 2.0"):
        opt.step(grad_scale=2.0)
    with pytest.raises(TypeError, match="found_inf must be a one-element tensor.*got bool True"):
        opt.step(found_inf=True)
    assert torch.equal(p.detach().cpu(), torch.zeros(3))


@pytest.mark.parametrize("info,config", cases("contract", "torch_counterpart", variants=True))
def test_float64_lr_tensor_is_not_rounded_to_float32(info, config):
    # torch.optim on float64 params with lr=torch.tensor(0.1, float64) is the reference;
    # rounding the lr to float32 moved results by ~1e-8 relative: 8 float64 ulps of the
    # largest |param| tell them apart.
    a = [p.detach().double().requires_grad_() for p in make_params(sizes=(15, 7))]
    b = clone_params(a)
    ours = info.make(a, config)
    for group in ours.param_groups:
        group["lr"] = torch.tensor(0.1, dtype=torch.float64)
    theirs = info.torch_optimizer(b, **{**config.kwargs, "lr": torch.tensor(0.1, dtype=torch.float64)})
    for seed in range(5):
        set_grads(a, seed)
        set_grads(b, seed)
        ours.step()
        theirs.step()
    for p, q in zip(a, b):
        ulps_close(p, q, 8)


@pytest.mark.parametrize("info", cases("contract", "apex_attributes"))
@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_groups_without_an_option_take_the_constructors(device, info):
    # Apex's FusedLAMB / FusedSGD / FusedAdagrad / FusedNovoGrad kept these options as
    # attributes: its checkpoints' groups lack them. They must come from the
    # constructor (as Apex's did), not from a fixed default, nor raise KeyError. With
    # weight decay, which most of them change the use of.
    keys = tuple(info.apex_attributes)
    assert keys

    def make(ps):
        return info.make(ps, weight_decay=0.1, **info.apex_attributes)

    a = make_params(sizes=(15, 7), device=device)
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


@pytest.mark.parametrize("info", cases("contract", "apex_group_step"))
@pytest.mark.parametrize("device", DEVICES)
def test_apex_checkpoint_with_per_group_step_resumes_its_count(device, info):
    # Apex's FusedAdam / FusedLAMB / FusedMixedPrecisionLamb keep the step count in
    # param_groups[i]['step'] and no per-param 'step'; bias correction must continue
    # from it, not restart.
    n = 30
    a = make_params(sizes=(15, 7), device=device)
    ref = info.make(a)
    steps(ref, a, range(n))
    sd = ref.state_dict()
    apex_sd = {"state": {k: {key: v.clone() for key, v in st.items() if key != "step"}
                         for k, st in sd["state"].items()},
               "param_groups": [{**g, "step": n} for g in sd["param_groups"]]}
    b = clone_params(a)
    resumed = info.make(b)
    resumed.load_state_dict(apex_sd)
    steps(ref, a, range(n, n + 3))
    steps(resumed, b, range(n, n + 3))
    assert resumed.state[b[0]]["step"].item() == n + 3
    assert_equal(a, b)


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_load_hooks_act_as_on_torch_optim(device, info):
    """A pre-hook's edits are what is checked and loaded (here: the state of a model
    whose first param grew from 15 to 20 rows, padded by the hook), and a post-hook
    has the last word over the float32 state core_ops restores after torch's loader."""
    a = make_params(sizes=(15, 7), device=device)
    src = info.make(a)
    steps(src, a, [1, 2])
    b = [torch.zeros(20, device=device, requires_grad=True), torch.zeros(7, device=device, requires_grad=True)]
    dst = info.make(b)

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


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_writes_to_half_params_between_steps_reach_the_masters(device, info):
    """Note [Writes to half params]: a clamp under no_grad and new .data are taken into
    the masters, only where the half values changed; an unwritten param's master keeps
    its extra bits. lr=0 for the step after the writes, so the masters show exactly
    what was taken in."""
    ps = make_params(torch.bfloat16, sizes=(64, 33, 17), device=device)
    opt = info.make(ps, master_weights=True)
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
    assert torch.equal(opt.state[ps[1]]["master_param"].cpu(), torch.full((33,), 0.25))
    assert torch.equal(opt.state[ps[2]]["master_param"], masters[2])
    # An unwritten param is not compared again: its mark still holds after a step.
    assert all(opt._write_marks()[id(p)] == (p._version, p.data_ptr()) for p in ps)


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_a_step_between_forward_and_backward_is_caught_by_autograd(device, info):
    """The kernels write params in place behind autograd's back; the step moves the
    version counters on as torch's in-place ops do, so a backward through values the
    step changed fails as with torch.optim instead of giving wrong grads."""
    ps = make_params(sizes=(8, 3), device=device)
    opt = info.make(ps)
    set_grads(ps, 1)
    loss = sum((p * p).sum() for p in ps)  # saves the params for backward
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("info", CONTRACT)
@pytest.mark.parametrize("device", DEVICES)
def test_a_load_from_inside_a_load_hook_works_as_on_torch_optim(device, info):
    """A pre-hook that hands the state dict to a loader which calls load_state_dict
    again: the inner load must not change the hook dicts the outer one is iterating."""
    a = make_params(torch.bfloat16, sizes=(15, 7), device=device)
    src = info.make(a, master_weights=True)
    steps(src, a, [1, 2])
    dst = info.make(clone_params(a), master_weights=True)
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
        assert set(dst.state[q]) > {"master_param"} and all(v.dtype == torch.float32 for v in dst.state[q].values())
