"""The Lightning plugin on one GPU (run by tests/gpu/run.sh; skipped without a GPU):
the Trainer with apex-O2 and apex-ddp (NCCL at world size 1) and Fabric with apex-O2
train on CUDA with fp16 conv and linear weights, fp32 BatchNorm and fp32 masters, and
give what a hand-written AmpLoop gives on the same GPU, bit for bit (the plugin adds no
numerics; cuDNN is made deterministic so that two runs of the same math agree)."""

import lightning as L
import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

import core_ops_lightning  # noqa: F401  (registers the apex-* names)
from core_ops.amp import AmpLoop
from lightning_cases import flat, loader, make_module

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
Net = make_module(pl)
QUIET = dict(accelerator="gpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False)


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


def hand_written_on_gpu():
    loop = AmpLoop("O2", half_dtype=torch.float16)
    model = Net(seed=0).cuda()
    loop.prepare_model(model)
    opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    sched = loop.follow_skips(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95))
    for x, y in loader():  # Net's scheduler steps every batch
        with loop.autocast("cuda"):
            loss = F.cross_entropy(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loop.scale(loss).backward()
        loop.unscale_(opt)
        loop.step(opt)
        loop.update()
        sched.step()
    return model


@pytest.mark.parametrize("strategy", ["auto", "apex-ddp"])
def test_the_trainer_trains_on_a_gpu_as_a_hand_written_loop(strategy):
    model = Net(seed=0)
    trainer = pl.Trainer(precision="apex-O2", strategy=strategy, max_epochs=1, **QUIET)
    trainer.fit(model, loader())
    conv, bn = model.net[0], model.net[1]
    assert conv.weight.is_cuda and conv.weight.dtype == torch.float16
    assert bn.weight.dtype == torch.float32  # BatchNorm kept in fp32 at O2
    assert float(trainer.callback_metrics["train_loss"]) < 1.4
    if strategy == "auto":  # apex-ddp swaps in SyncBatchNorm, whose kernels round their own way
        assert torch.equal(flat(model.parameters()), flat(hand_written_on_gpu().parameters()))


def test_fabric_trains_on_a_gpu():
    fabric = L.Fabric(precision="apex-O2", accelerator="cuda", devices=1)
    model = Net(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = fabric.setup(model, opt)
    losses = []
    for _ in range(3):
        for x, y in fabric.setup_dataloaders(loader()):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            fabric.backward(loss)
            opt.step()
            losses.append(float(loss))
    weight = model.module.net[0].weight if hasattr(model, "module") else model.net[0].weight
    assert weight.is_cuda and weight.dtype == torch.float16
    assert all(torch.isfinite(torch.tensor(losses))) and sum(losses[-4:]) < sum(losses[:4])


def test_trainer_apex_fsdp_on_one_gpu():
    # FSDP2 over NCCL at world size 1: the float32 shards on the GPU are the masters,
    # the blocks compute in fp16, and the fit learns.
    from lightning_fsdp_runs import Block
    from lightning_fsdp_runs import Net as FSDPNet
    from lightning_fsdp_runs import loader as fsdp_loader
    model = FSDPNet()
    seen = []
    model.body[0][0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    pl.Trainer(precision="apex-O2", strategy=core_ops_lightning.ApexFSDPStrategy(auto_wrap_policy={Block}),
               max_epochs=3, **QUIET).fit(model, fsdp_loader())
    losses = torch.stack([h["loss"] for h in model.history])
    assert {(p.dtype, p.device.type, type(p).__name__) for p in model.parameters()} == {(torch.float32, "cuda", "DTensor")}
    assert seen[0] == torch.float16
    assert torch.isfinite(losses[-8:]).all() and losses[-8:].mean() < losses[:8][torch.isfinite(losses[:8])].mean()
