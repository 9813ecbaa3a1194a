"""A real 2-process run of ``strategy="apex-fsdp"`` (and of Lightning's own
ModelParallelStrategy under ``precision="apex-O2-bf16"``) on CPU with gloo, several
fits in one launch:

    python lightning_fsdp_runs.py OUT          # Trainers: each rank saves OUT/fsdp-rank<r>.pt
    python lightning_fsdp_runs.py fabric OUT   # Fabric: OUT/fabric-rank<r>.pt
    python lightning_fsdp_runs.py four OUT     # 4 processes: OUT/four-rank<r>.pt, fabric4-rank<r>.pt

FSDP2 shards each rank's own tensors, so every rank builds the model from one seed.
"""

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

import core_ops_lightning  # noqa: F401  (the apex-* names)
from core_ops.optimizers import FusedAdam
from core_ops_lightning import ApexFSDPStrategy

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
from teardown import leave_process_group  # noqa: E402
from small_task import Block  # noqa: E402


class Net(pl.LightningModule):
    """Blocks and a head; records each step's loss, loss scale and whole params.
    ``inf_at=(step, rank)``: that rank's loss is inf at that step. ``shard_in_configure``:
    the module shards itself (for ModelParallelStrategy)."""

    def __init__(self, inf_at=None, shard_in_configure=False):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(Block(), Block(), nn.Linear(16, 5))
        self.inf_at, self.shard_in_configure = inf_at, shard_in_configure
        self.history = []

    def configure_model(self):
        if self.shard_in_configure:
            from torch.distributed.fsdp import fully_shard
            from core_ops.amp import fsdp_policy
            mesh = self.device_mesh["data_parallel"]
            policy = fsdp_policy("O2", torch.bfloat16)
            for block in list(self.body)[:2]:
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(self, mesh=mesh, mp_policy=policy)

    def forward(self, x):
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x).float(), y)
        if self.inf_at == (self.global_step, self.global_rank):
            loss = loss * float("inf")
        self._loss = loss.detach()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        scale = self.trainer.precision_plugin.loss_scale if hasattr(self.trainer.precision_plugin, "loss_scale") else 1.0
        self.history.append(dict(step=self.global_step, loss=self._loss, scale=float(scale),
                                 params=torch.cat([_whole(p).reshape(-1) for p in self.parameters()])))

    def configure_optimizers(self):
        return FusedAdam(self.parameters(), lr=1e-2)


def offload_of(module):
    """{(each FSDP2 unit's offload policy, whether FSDP2 keeps each of its params on the
    CPU)}, from torch's private FSDP2 state: what fully_shard was given."""
    groups = [m._get_fsdp_state()._fsdp_param_group for m in module.modules() if hasattr(m, "_get_fsdp_state")]
    return sorted({(type(g.offload_policy).__name__, all(fp.offload_to_cpu for fp in g.fsdp_params))
                   for g in groups if g is not None})


def _whole(p):
    return p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach().clone()


def loader():
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 5, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=8)


def fit(key, results, model=None, ckpt_path=None, devices=2, **kw):
    model = Net() if model is None else model  # a compiled module has no truth value
    trainer = pl.Trainer(accelerator="cpu", devices=devices, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **kw)
    trainer.fit(model, loader(), ckpt_path=ckpt_path)
    results["rank"] = trainer.global_rank
    results[key] = dict(history=model.history, dtypes=sorted({str(p.dtype) for p in model.parameters()}),
                        types=sorted({type(p).__name__ for p in model.parameters()}),
                        local=sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                  for p in model.parameters()),
                        whole=sum(p.numel() for p in model.parameters()))
    return trainer


def fabric_run(out, devices=2):
    """Fabric(precision="apex-O2", strategy="apex-fsdp") against apex-ddp: 4 steps of the
    same batches, the last rank's loss inf at step 2, grads clipped to 0.5; on 2
    processes, a resume too."""
    import lightning as L
    from core_ops_lightning.fabric import ApexDDPStrategy
    results = {}
    # Both ranks take the same batches (no distributed sampler); apex-ddp sums the ranks'
    # grads in float32 as FSDP2's reduce-scatter does (an fp16 sum of two equal grads
    # overflows where one does not).
    for name, strategy in (("apex-fsdp", "apex-fsdp"), ("apex-ddp", ApexDDPStrategy(allreduce_always_fp32=True))):
        fabric = L.Fabric(precision="apex-O2", strategy=strategy, accelerator="cpu", devices=devices)
        fabric.launch()
        torch.manual_seed(0)
        model = fabric.setup_module(nn.Sequential(Block(), Block(), nn.Linear(16, 5)))
        opt = fabric.setup_optimizers(FusedAdam(model.parameters(), lr=1e-2))
        history = []
        for step, (x, y) in enumerate(loader()):
            if step == 4:
                break
            opt.zero_grad()
            loss = F.mse_loss(model(x).float(), y)
            if (step, fabric.global_rank) == (2, devices - 1):
                loss = loss * float("inf")
            fabric.backward(loss)
            norm = fabric.clip_gradients(model, opt, max_norm=0.5)
            opt.step()
            history.append(dict(loss=loss.detach(), scale=fabric.strategy.precision.loss_scale,
                                norm=None if norm is None else torch.as_tensor(norm).detach().float(),
                                params=torch.cat([_whole(p).float().reshape(-1) for p in model.parameters()])))
        if name == "apex-fsdp" and devices == 2:
            results["resume"] = fabric_resume(fabric, out)
        results[name] = dict(history=history, dtypes=sorted({str(p.dtype) for p in model.parameters()}),
                                 types=sorted({type(p).__name__ for p in model.parameters()}))
        results["rank"] = fabric.global_rank
    torch.save(results, out / f"fabric{'' if devices == 2 else devices}-rank{results['rank']}.pt")


def fabric_resume(fabric, out):
    """4 steps straight, and 2 steps, fabric.save (a sharded checkpoint), a fresh model
    and optimizer fabric.load-ed, 2 steps: the whole params after each, and the scale."""
    def fresh():
        torch.manual_seed(0)
        model = fabric.setup_module(nn.Sequential(Block(), Block(), nn.Linear(16, 5)))
        return model, fabric.setup_optimizers(FusedAdam(model.parameters(), lr=1e-2))

    def steps(model, opt, batches):
        for x, y in batches:
            opt.zero_grad()
            fabric.backward(F.mse_loss(model(x).float(), y))
            opt.step()
        return torch.cat([_whole(p).reshape(-1) for p in model.parameters()])

    batches = list(loader())[:4]
    straight = steps(*fresh(), batches)
    model, opt = fresh()
    steps(model, opt, batches[:2])
    fabric.save(out / "fabric.ckpt", {"model": model, "optimizer": opt, "amp": fabric.strategy.precision})
    model, opt = fresh()
    fabric.load(out / "fabric.ckpt", {"model": model, "optimizer": opt, "amp": fabric.strategy.precision})
    return dict(straight=straight, resumed=steps(model, opt, batches[2:]), is_dir=(out / "fabric.ckpt").is_dir())


def four(out):
    """apex-fsdp and apex-ddp on 4 processes, rank 3's loss inf at step 1. apex-ddp sums
    in float32 as FSDP2 does (4 ranks' fp16 grads overflow an fp16 sum at the first scale
    where each alone does not)."""
    from core_ops_lightning import ApexDDPStrategy
    results = {}
    for key, strategy in (("fsdp", ApexFSDPStrategy(auto_wrap_policy={Block})),
                          ("ddp", ApexDDPStrategy(allreduce_always_fp32=True))):
        fit(key, results, model=Net(inf_at=(1, 3)), precision="apex-O2", strategy=strategy, max_epochs=2,
            gradient_clip_val=0.5, devices=4)
    torch.save(results, out / f"four-rank{results['rank']}.pt")


def main():
    if sys.argv[1] == "fabric":
        return fabric_run(Path(sys.argv[2]))
    if sys.argv[1] == "four":
        four(Path(sys.argv[2]))
        return fabric_run(Path(sys.argv[2]), devices=4)
    out = Path(sys.argv[1])
    results = {}
    fsdp = ApexFSDPStrategy(auto_wrap_policy={Block})
    # O2 (fp16, dynamic scale) on FSDP2, with an inf on rank 1 only at step 2, clipped;
    # and the same on apex-ddp.
    fit("fsdp", results, model=Net(inf_at=(2, 1)), precision="apex-O2", strategy=fsdp, max_epochs=1,
        gradient_clip_val=0.5)
    fit("ddp", results, model=Net(inf_at=(2, 1)), precision="apex-O2", strategy="apex-ddp", max_epochs=1,
        gradient_clip_val=0.5)
    # FSDP2's CPU offload through the strategy's cpu_offload (True: not pinned without
    # CUDA): the same fit as "fsdp" otherwise.
    offloaded = Net(inf_at=(2, 1))
    trainer = fit("fsdp_offload", results, model=offloaded, precision="apex-O2",
                  strategy=ApexFSDPStrategy(auto_wrap_policy={Block}, cpu_offload=True), max_epochs=1,
                  gradient_clip_val=0.5)
    results["fsdp_offload"].update(offload=offload_of(offloaded), optimizer=type(trainer.optimizers[0]).__name__,
                                   state_devices=sorted({str(v.to_local().device if hasattr(v, "to_local") else v.device)
                                                         for s in trainer.optimizers[0].state.values()
                                                         for v in s.values()}))
    # Compiled in place (nn.Module.compile): Lightning refuses a torch.compile'd module
    # (an OptimizedModule) on any strategy but its DDP and FSDP1 ones.
    compiled = Net(inf_at=(2, 1))
    compiled.compile(backend="aot_eager")
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]
    fit("fsdp_compiled", results, model=compiled, precision="apex-O2",
        strategy=ApexFSDPStrategy(auto_wrap_policy={Block}), max_epochs=1, gradient_clip_val=0.5)
    results["fsdp_compiled"]["graphs"] = counters["stats"]["unique_graphs"] - graphs
    # Resume from a sharded checkpoint (a torch.distributed.checkpoint folder) and from a
    # full one: exactly the uninterrupted run.
    fit("whole", results, precision="apex-O2", strategy="apex-fsdp", max_epochs=2)
    for form, save_distributed in (("sharded", True), ("full", False)):
        strategy = lambda: ApexFSDPStrategy(auto_wrap_policy={Block}, save_distributed_checkpoint=save_distributed)  # noqa: E731
        trainer = fit(f"first_{form}", results, precision="apex-O2", strategy=strategy(), max_epochs=1)
        ckpt = out / f"{form}.ckpt"
        trainer.save_checkpoint(ckpt)
        fit(f"resumed_{form}", results, precision="apex-O2", strategy=strategy(), max_epochs=2, ckpt_path=ckpt)
        results[f"{form}_is_dir"] = ckpt.is_dir()
    # Lightning's own FSDP2 strategy, the module sharding itself.
    fit("model_parallel", results, model=Net(shard_in_configure=True), precision="apex-O2-bf16",
        strategy=pl.strategies.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), max_epochs=1)
    torch.save(results, out / f"fsdp-rank{results['rank']}.pt")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    leave_process_group()
