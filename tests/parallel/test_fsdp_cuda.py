"""Apex's opt levels on FSDP2 over NCCL at world size 1 (run by tests/gpu/run.sh on a GPU
machine; skipped here): the CUDA kernels on the float32 shards (Note [Opt levels on
FSDP2]) for every fused optimizer of the registry (tests/optimizers/optimizer_registry.py,
generic test "sharded"; LAMB's and NovoGrad's whole-tensor norms through an NCCL
all_reduce), an overflow skipped, and an exact resume from a
torch.distributed.checkpoint folder."""

import datetime
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from _launch import free_port
from core_ops import amp
from core_ops.optimizers import FusedAdam

sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers"))
from optimizer_registry import cases  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def nccl():
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def sharded(seed=0):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64))
                            for _ in range(2)], nn.Linear(64, 8)).cuda()
    for block in list(model)[:-1]:
        fully_shard(block)
    return fully_shard(model)


def train(model, opt, start, steps, inf_at=None):
    losses = []
    g = torch.Generator().manual_seed(0)  # one batch, learned step after step
    x, y = torch.randn(32, 64, generator=g).cuda(), torch.randn(32, 8, generator=g).cuda()
    for i in range(start, start + steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x).float(), y)
        if i == inf_at:
            loss = loss * float("inf")
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("info", cases("sharded"))
def test_o2_on_fsdp2_over_nccl(nccl, half, info):
    model = sharded()
    model, opt = amp.initialize(model, info.make(model.parameters(), lr=1e-2), opt_level="O2", half_dtype=half,
                                verbosity=0)
    seen = []
    model[0][0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    before = [p.full_tensor().clone() for p in model.parameters()]
    losses = train(model, opt, 0, 8, inf_at=3)
    assert seen[0] == half and {p.dtype for p in model.parameters()} == {torch.float32}
    assert not torch.isfinite(losses[3]) and torch.isfinite(losses[[0, 1, 2, 4, 5, 6, 7]]).all()
    assert amp.skipped_steps() >= 1  # the inf step (fp16 may skip its first too)
    assert losses[7] < losses[0]
    assert not all(torch.equal(a, p.full_tensor()) for a, p in zip(before, model.parameters()))


def test_o2_on_fsdp2_resumes_exactly_from_a_sharded_checkpoint(nccl, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def fresh():
        model = sharded()
        return amp.initialize(model, FusedAdam(model.parameters(), lr=1e-3), opt_level="O2", verbosity=0)

    model, opt = fresh()
    straight = train(model, opt, 0, 6)
    expected = [p.full_tensor() for p in model.parameters()]
    model, opt = fresh()
    train(model, opt, 0, 3)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp_path))
    saved_amp = amp.state_dict()
    model, opt = fresh()
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(tmp_path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    amp.load_state_dict(saved_amp)
    rest = train(model, opt, 3, 3)
    assert torch.equal(rest, straight[3:])
    assert all(torch.equal(a, p.full_tensor()) for a, p in zip(expected, model.parameters()))


# The expected gain of FusedAdam on FSDP2's CPU-offloaded shards, unmeasured until
# tests/gpu/run.sh runs this (its "offload" step prints the figures): FusedAdam's step
# (one fused pass an element, Note [Adam as torch.optim computes it]) against
# torch.optim.AdamW(foreach=True), whose CPU foreach ops make a pass over memory per op.
CPU_STEP_TARGET = 0.5


def _offloaded_step_seconds(make_optimizer, repeats=5):
    """The median seconds of optimizer.step() on the CPU shards of a 16.8M-param model
    sharded with CPUOffloadPolicy over NCCL at world size 1 (grads from one GPU backward)."""
    import time

    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)]).cuda()
    for layer in model:
        fully_shard(layer, offload_policy=CPUOffloadPolicy(pin_memory=True))
    fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=True))
    opt = make_optimizer(model.parameters())
    model(torch.randn(64, 2048, device="cuda")).square().mean().backward()
    torch.cuda.synchronize()
    assert {p.to_local().device.type for p in model.parameters()} == {"cpu"}
    assert {p.grad.to_local().device.type for p in model.parameters()} == {"cpu"}
    times = []
    for i in range(repeats + 2):  # 2 warm-up steps (the state made at the first)
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    assert {v.to_local().device.type for s in opt.state.values() for v in s.values() if v.dim()} == {"cpu"}
    return sorted(times[2:])[repeats // 2]


def test_cpu_offload_fused_adam_step_against_torch_adamw(nccl):
    fused = _offloaded_step_seconds(lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01))
    torch_adamw = _offloaded_step_seconds(lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=True))
    ratio = fused / torch_adamw
    print(f"FSDP2 CPUOffloadPolicy, 16.8M params on the CPU: FusedAdam step {fused * 1e3:.1f} ms, "
          f"AdamW(foreach) {torch_adamw * 1e3:.1f} ms, ratio {ratio:.2f} (target <= {CPU_STEP_TARGET})")
    assert ratio <= CPU_STEP_TARGET, f"FusedAdam's offloaded step is {ratio:.2f}x torch's AdamW(foreach)"
