"""amp at O2 with master_weights="remainder": the model is bfloat16 and core_ops'
FusedAdam keeps the masters' lower halves (Note [Master remainders]); training is the
fp32-master run's, bit for bit in losses and params (masters: one float32 ulp where
an update lands on a rounding tie), from the same start (the remainders are taken
from the float32 weights before the cast)."""

import pytest
import torch

from core_ops import amp
from core_ops.optimizers import FusedAdam
from core_ops.reference.compact_state import join_master


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.BatchNorm1d(256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 8))


def batches(n=25, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)) for _ in range(n)]


def train(model, opt, data):
    losses = []
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def initialized(master_weights, state_dtype=torch.float32, seed=0):
    model = make_model(seed)
    opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01, state_dtype=state_dtype)
    return amp.initialize(model, opt, opt_level="O2", half_dtype=torch.bfloat16, master_weights=master_weights,
                          verbosity=0)


def test_o2_with_remainders_trains_as_o2_with_fp32_masters():
    data = batches()
    model_a, opt_a = initialized(True)
    model_b, opt_b = initialized("remainder")
    assert train(model_a, opt_a, data) == train(model_b, opt_b, data)
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        assert p.dtype == q.dtype and torch.equal(p, q)
    assert model_b[1].weight.dtype == torch.float32  # BatchNorm kept float32, its own master
    masters = list(amp.master_params(opt_a))
    halves = [p for p in model_b.parameters() if p.dtype == torch.bfloat16]
    assert len(halves) == 4 and not any("master_param" in opt_b.state[p] for p in halves)
    for p in halves:
        mine = join_master(p.detach(), opt_b.state[p]["master_remainder"])
        theirs = next(m for m in masters if m.shape == p.shape and torch.equal(m.detach().bfloat16(), p.detach()))
        gap = (mine - theirs.detach()).abs().max() / (theirs.abs().max() * torch.finfo(torch.float32).eps)
        assert int((mine != theirs.detach()).sum()) <= max(2, p.numel() // 1000) and gap <= 4


def test_remainders_start_from_the_float32_weights():
    fp32 = make_model()
    model, opt = initialized("remainder")
    for p, q in zip(fp32.parameters(), model.parameters()):
        if q.dtype != torch.bfloat16:
            continue
        back = join_master(q.detach(), opt.state[q]["master_remainder"])
        ties = (p.detach().view(torch.int32) & 0xFFFF) == 0x8000
        assert torch.equal(back[~ties], p.detach()[~ties])


def test_8bit_moments_with_remainders_hold_six_bytes_a_param_and_train():
    data = batches(40)
    model_a, opt_a = initialized(True)
    model_b, opt_b = initialized("remainder", state_dtype="int8")
    losses_a, losses_b = train(model_a, opt_a, data), train(model_b, opt_b, data)
    assert abs(losses_b[-1] - losses_a[-1]) <= 0.05 * losses_a[-1]
    big = model_b[0].weight  # 16384 elements: 8-bit moments
    state = opt_b.state[big]
    per_param = (big.numel() * 2 + sum(t.numel() * t.element_size() for k, t in state.items() if k != "step")) / big.numel()
    assert per_param == pytest.approx(6.03125)


def test_a_resumed_run_is_the_straight_run(tmp_path):
    data = batches(20)
    straight_model, straight_opt = initialized("remainder", state_dtype="int8")
    train(straight_model, straight_opt, data)
    model, opt = initialized("remainder", state_dtype="int8")
    train(model, opt, data[:8])
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "amp": amp.state_dict()}, tmp_path / "ck.pt")
    model, opt = initialized("remainder", state_dtype="int8", seed=5)
    saved = torch.load(tmp_path / "ck.pt")
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    amp.load_state_dict(saved["amp"])
    train(model, opt, data[8:])
    for p, q in zip(straight_model.parameters(), model.parameters()):
        assert torch.equal(p, q)


def test_what_remainders_cannot_hold_is_refused():
    model = make_model()
    with pytest.raises(ValueError, match="pass half_dtype=torch.bfloat16, or pass master_weights=True for float16"):
        amp.initialize(model, FusedAdam(model.parameters()), opt_level="O2", master_weights="remainder", verbosity=0)
    model = make_model()
    with pytest.raises(ValueError, match="optimizers\\[0\\]: master_weights='remainder' keeps the masters' "
                                         "lower halves inside core_ops.optimizers.FusedAdam's step, and this "
                                         "optimizer is torch.optim.adamw.AdamW"):
        amp.initialize(model, torch.optim.AdamW(model.parameters()), opt_level="O2", half_dtype=torch.bfloat16,
                       master_weights="remainder", verbosity=0)
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # refused before the cast
    with pytest.raises(ValueError, match="master_weights='fp32': expected one of 1, true, .*, or remainder"):
        amp.initialize(make_model(), opt_level="O2", master_weights="fp32", verbosity=0)
