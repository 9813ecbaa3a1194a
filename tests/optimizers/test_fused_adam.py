"""FusedAdam against torch.optim.Adam / AdamW, on CPU (the native kernel), and its
behaviour as a torch.optim.Optimizer: scaling, skipping, master weights, state dicts.

Note [Optimizer tolerances]: after 20 steps the fp32 params agree with torch.optim to
a few ulps of their magnitude (the CPU kernel rounds every + and * as torch does;
the pow in the bias corrections and sqrt may differ by an ulp); we allow 8 ulps of
the largest |param|. float64: the reference against torch in fp64, 1e-12.
"""

import copy
import warnings

import pytest
import torch
from optim_cases import STEPS, clone_params, make_params, run, ulps_close

import core_ops  # noqa: F401
from core_ops import _build
from core_ops.optimizers import FusedAdam
from core_ops.reference import KERNELS as REF


@pytest.fixture(autouse=True)
def _native():
    assert _build.ensure("cpu").native


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["", "amsgrad"])
@pytest.mark.parametrize("maximize", [False, True], ids=["", "maximize"])
def test_fp32_matches_torch_fused(adam_w_mode, amsgrad, maximize):
    ours, theirs = make_params(), None
    theirs = clone_params(ours)
    kw = dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05, amsgrad=amsgrad, maximize=maximize)
    opt = FusedAdam(ours, adam_w_mode=adam_w_mode, **kw)
    ref = (torch.optim.AdamW if adam_w_mode else torch.optim.Adam)(theirs, fused=True, **kw)
    run(opt, ours)
    run(ref, theirs)
    for a, b in zip(ours, theirs):
        ulps_close(a.detach(), b.detach())
        ulps_close(opt.state[a]["exp_avg_sq"], ref.state[b]["exp_avg_sq"])
        assert opt.state[a]["step"].item() == ref.state[b]["step"].item() == STEPS


def test_no_bias_correction_matches_reference():
    ours = make_params(sizes=(33,))
    theirs = clone_params(ours)
    opt = FusedAdam(ours, bias_correction=False, lr=1e-2)
    run(opt, ours, steps=5)
    # Reference kernel through the same optimizer: swap the op for the reference.
    state = {"exp_avg": torch.zeros(33), "exp_avg_sq": torch.zeros(33), "step": torch.zeros(())}
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grad = torch.randn(33, generator=g)
        REF["fused_adam_"]([theirs[0].data], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [],
                           [state["step"]], 1e-2, 0.9, 0.999, 1e-8, 0.0, True, False, False, False,
                           None, None, None)
    ulps_close(ours[0].detach(), theirs[0].detach(), n=2)


def test_fp64_reference_matches_torch():
    ours = make_params(torch.float64)
    theirs = clone_params(ours)
    opt = FusedAdam(ours, lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, foreach=False)
    run(opt, ours)
    run(ref, theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_master_weights_follow_the_fp32_run(dtype):
    ours = make_params(dtype)
    fp32 = clone_params(ours, torch.float32)
    opt = FusedAdam(ours, lr=1e-2, weight_decay=0.01, master_weights=True)
    ref = torch.optim.AdamW(fp32, lr=1e-2, weight_decay=0.01, fused=True)
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        for a, b in zip(ours, fp32):
            grad = torch.randn(a.shape, generator=g).to(dtype)
            a.grad, b.grad = grad, grad.float()
        opt.step()
        ref.step()
    for a, b in zip(ours, fp32):
        master = opt.state[a]["master_param"]
        assert master.dtype == torch.float32
        ulps_close(master, b.detach())
        assert torch.equal(a.detach(), master.to(dtype))  # the param is the master, rounded
        assert opt.state[a]["exp_avg"].dtype == torch.float32


def test_half_params_without_masters_keep_fp32_state():
    ours = make_params(torch.bfloat16, sizes=(100,))
    opt = FusedAdam(ours, lr=1e-2)
    run(opt, ours, steps=3)
    assert opt.state[ours[0]]["exp_avg"].dtype == torch.float32
    assert "master_param" not in opt.state[ours[0]]


def snapshot(opt, params):
    return [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict())


def assert_unchanged(before, opt, params):
    ps, sd = before
    assert all(torch.equal(a, b.detach()) for a, b in zip(ps, params))
    now = opt.state_dict()
    for k, st in sd["state"].items():
        for key, value in st.items():
            assert torch.equal(value, now["state"][k][key]), key


def test_found_inf_skips_everything():
    params = make_params(torch.bfloat16, sizes=(17, 300))
    opt = FusedAdam(params, lr=1e-2, master_weights=True, amsgrad=True)
    run(opt, params, steps=2)
    before = snapshot(opt, params)
    for flag in (torch.ones(1), torch.ones(1, dtype=torch.int32)):
        run(opt, params, steps=1, found_inf=flag)
        assert_unchanged(before, opt, params)


def test_grad_scale_divides_grads_inside():
    a, b = make_params(sizes=(1000,)), None
    b = clone_params(a)
    oa, ob = FusedAdam(a, lr=1e-2), FusedAdam(b, lr=1e-2)
    g = torch.randn(1000)
    a[0].grad, b[0].grad = g * 1024, g.clone()
    oa.step(grad_scale=torch.tensor([1024.0]))
    ob.step()
    assert torch.equal(a[0].detach(), b[0].detach())
    assert torch.equal(a[0].grad, g)  # written back unscaled, exactly (a power of two)


def test_torch_grad_scaler_protocol_matches_torch_fused():
    torch.manual_seed(0)
    models = [torch.nn.Linear(64, 32), None]
    models[1] = copy.deepcopy(models[0])
    opts = [FusedAdam(models[0].parameters(), lr=1e-2, weight_decay=0.01),  # Apex's default is 0,
            torch.optim.AdamW(models[1].parameters(), lr=1e-2, weight_decay=0.01, fused=True)]  # torch's 0.01
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 10), torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)]
    x = torch.randn(16, 64)
    for step in range(6):
        for model, opt, scaler in zip(models, opts, scalers):
            opt.zero_grad()
            scaler.scale(model(x).square().mean()).backward()
            if step == 3:  # an overflow: both must skip and back off
                next(model.parameters()).grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() == 2.0 ** 9
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        ulps_close(a.detach(), b.detach())


def test_max_grad_norm_matches_unscale_clip_step():
    torch.manual_seed(0)
    a = make_params(sizes=(300, 40))
    b = clone_params(a)
    oa, ob = FusedAdam(a, lr=1e-2), torch.optim.AdamW(b, lr=1e-2, weight_decay=0.0, fused=True)
    scale = torch.tensor([256.0])
    for _ in range(5):
        grads = [torch.randn(p.shape) * 3 for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g * 256, g.clone()
        found = torch.zeros(1)
        oa.step(grad_scale=scale, found_inf=found, max_grad_norm=1.0)
        norm = torch.nn.utils.clip_grad_norm_(b, 1.0)
        ob.step()
        assert found.item() == 0
        torch.testing.assert_close(oa.last_grad_norm, norm, rtol=1e-5, atol=0)
    for p, q in zip(a, b):
        ulps_close(p.detach(), q.detach(), n=64)  # clip coefficient rounds differently


def test_max_grad_norm_flags_overflow():
    a = make_params(sizes=(30,))
    opt = FusedAdam(a, lr=1e-2)
    a[0].grad = torch.full((30,), float("inf"))
    before = a[0].detach().clone()
    found = torch.zeros(1)
    opt.step(found_inf=found, max_grad_norm=1.0)
    assert found.item() == 1 and torch.equal(a[0].detach(), before)
    assert opt.state[a[0]]["step"].item() == 0


@pytest.mark.parametrize("source", ["torch_adam", "torch_adamw"])
def test_torch_state_dict_loads_and_continues(source):
    a = make_params(sizes=(64, 7))
    b = clone_params(a)
    adamw = source == "torch_adamw"
    T = torch.optim.AdamW if adamw else torch.optim.Adam
    ref = T(a, lr=1e-2, weight_decay=0.1)
    run(ref, a, steps=5)
    for p, q in zip(a, b):
        q.data.copy_(p.data)
    ours = FusedAdam(b, lr=1.0, adam_w_mode=not adamw)  # the state dict must win
    ours.load_state_dict(ref.state_dict())
    assert ours.param_groups[0]["adam_w_mode"] is adamw and ours.param_groups[0]["lr"] == 1e-2
    run(ref, a, steps=5, seed=7)
    run(ours, b, steps=5, seed=7)
    for p, q in zip(a, b):
        ulps_close(q.detach(), p.detach())


@pytest.mark.parametrize("adamw", [False, True])
def test_a_torch_2_6_state_dict_keeps_the_constructor_s_mode_and_says_so(adamw):
    """torch's Adam / AdamW saved no decoupled_weight_decay before 2.7: which decay the
    checkpoint used is unknown, so the group keeps FusedAdam's and a warning says how to
    set it."""
    a = make_params(sizes=(64, 7))
    ref = (torch.optim.AdamW if adamw else torch.optim.Adam)(a, lr=1e-2, weight_decay=0.1)
    run(ref, a, steps=2)
    state = ref.state_dict()
    del state["param_groups"][0]["decoupled_weight_decay"]  # as torch 2.6 wrote it
    ours = FusedAdam(clone_params(a), lr=1.0, adam_w_mode=not adamw)
    with pytest.warns(UserWarning, match=f"it keeps this FusedAdam's adam_w_mode={not adamw}"):
        ours.load_state_dict(state)
    assert ours.param_groups[0]["adam_w_mode"] is (not adamw) and ours.param_groups[0]["lr"] == 1e-2
    state["param_groups"][0]["weight_decay"] = 0.0  # no decay: the mode does not matter, nothing said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FusedAdam(clone_params(a), adam_w_mode=not adamw).load_state_dict(state)


def test_our_state_dict_loads_into_torch_and_continues():
    a = make_params(sizes=(64, 7))
    ours = FusedAdam(a, lr=1e-2, weight_decay=0.1)
    run(ours, a, steps=5)
    b = clone_params(a)
    ref = torch.optim.AdamW(b, lr=5.0, weight_decay=0.0)
    ref.load_state_dict(copy.deepcopy(ours.state_dict()))  # as from a checkpoint file
    assert ref.param_groups[0]["weight_decay"] == 0.1 and ref.param_groups[0]["lr"] == 1e-2
    run(ours, a, steps=5, seed=7)
    run(ref, b, steps=5, seed=7)
    for p, q in zip(a, b):
        ulps_close(q.detach(), p.detach())


def test_checkpoint_round_trip_with_master_weights_is_exact():
    a = make_params(torch.bfloat16, sizes=(129, 3))
    opt = FusedAdam(a, lr=1e-2, master_weights=True)
    run(opt, a, steps=3)
    sd = copy.deepcopy(opt.state_dict())
    b = clone_params(a)
    resumed = FusedAdam(b, lr=1e-2, master_weights=True)
    resumed.load_state_dict(sd)
    assert resumed.state[b[0]]["master_param"].dtype == torch.float32
    run(opt, a, steps=4, seed=9)
    run(resumed, b, steps=4, seed=9)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["master_param"], resumed.state[q]["master_param"])


def test_param_groups_lr_tensor_scheduler_and_zero_grad():
    a, b = make_params(sizes=(50,)), make_params(seed=5, sizes=(20,))
    a2, b2 = clone_params(a), clone_params(b)
    opt = FusedAdam([{"params": a, "lr": torch.tensor(1e-2)}, {"params": b, "weight_decay": 0.5}], lr=1e-3,
                    weight_decay=0.01)
    ref = torch.optim.AdamW([{"params": a2, "lr": torch.tensor(1e-2)}, {"params": b2, "weight_decay": 0.5}], lr=1e-3,
                            weight_decay=0.01, fused=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    rsched = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.5)
    g = torch.Generator().manual_seed(2)
    for _ in range(6):
        for p, q in zip(a + b, a2 + b2):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        opt.step(), ref.step(), sched.step(), rsched.step()
    for p, q in zip(a + b, a2 + b2):
        ulps_close(p.detach(), q.detach())
    opt.zero_grad()
    assert all(p.grad is None for p in a + b)
    opt.add_param_group({"params": make_params(seed=9, sizes=(4,)), "lr": 0.1})
    assert opt.param_groups[-1]["betas"] == (0.9, 0.999)


def test_bad_input():
    p = torch.zeros(3, requires_grad=True)
    for kwargs, match in [(dict(lr=-1.0), "lr"), (dict(betas=(1.0, 0.9)), "betas"), (dict(eps=-1e-8), "eps"),
                          (dict(weight_decay=-0.1), "weight_decay")]:
        with pytest.raises(ValueError, match=match):
            FusedAdam([p], **kwargs)
    with pytest.raises(ValueError, match="twice"):
        FusedAdam([p, p])
    with pytest.raises(ValueError, match="non-leaf"):
        FusedAdam([p * 2])
    with pytest.raises(TypeError, match="unexpected keyword"):
        FusedAdam([p], momentum=0.9)
    opt = FusedAdam([p])
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    q = torch.zeros(4, requires_grad=True)
    other = FusedAdam([q])
    q.grad = torch.ones(4)
    other.step()
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match="another model"):
        opt.load_state_dict(other.state_dict())
