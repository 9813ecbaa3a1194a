"""Real 2-process runs of the Lightning plugin (CPU, gloo), one launch per suite, each
fitting several times in the same processes so that the test pays for one start:

    python ddp_runs.py trainer OUT       # lightning.pytorch.Trainer
    python ddp_runs.py fabric OUT        # lightning.fabric.Fabric
    python ddp_runs.py standalone OUT    # pytorch_lightning.Trainer

Lightning's launcher starts rank 1 by running this script again; every rank saves its
results to OUT/<suite>-rank<r>.pt for test_ddp_runs.py to compare. Ranks build their
models from different seeds: DDP's broadcast must make them one.
"""

import copy
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import lightning_cases as cases  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
from teardown import leave_process_group  # noqa: E402


def trainer_kwargs(**kw):
    # log_every_n_steps=1: the histories read loss_scale and skipped_steps every step.
    return dict(accelerator="cpu", devices=2, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, **kw)


def fit(pl, out_key, results, model=None, ckpt_path=None, data=None, **kw):
    if model is None:  # not "model or": a compiled module has no truth value
        model = cases.make_module(pl)(seed=10 + int(os.environ.get("LOCAL_RANK", 0)))
    trainer = pl.Trainer(**trainer_kwargs(**kw))
    trainer.fit(model, data or cases.loader(), ckpt_path=ckpt_path)
    results["rank"] = trainer.global_rank
    results[out_key] = dict(history=model.history, params=cases.flat(model.parameters()),
                            collectives=model.backward_collectives,
                            types=sorted({type(m).__name__ for m in model.modules()}),
                            dtypes=sorted({str(p.dtype) for p in model.parameters()}))
    return trainer, model


def trainer_suite(pl, out):
    Net = cases.make_module(pl)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    results = {}
    # O2 + apex-ddp + SyncBN, with an inf on rank 1 only at step 2 and clipping.
    fit(pl, "o2", results, model=Net(seed=10 + rank, inf_at=(2, 1)), precision="apex-O2",
        strategy="apex-ddp", sync_batchnorm=True, max_epochs=1, gradient_clip_val=0.5)
    # The same, the module compiled (aot_eager: dynamo and AOTAutograd, no codegen).
    from torch._dynamo.utils import counters
    graphs = counters["stats"]["unique_graphs"]
    fit(pl, "o2_compiled", results, model=torch.compile(Net(seed=10 + rank, inf_at=(2, 1)), backend="aot_eager"),
        precision="apex-O2", strategy="apex-ddp", sync_batchnorm=True, max_epochs=1, gradient_clip_val=0.5)
    results["o2_compiled"]["graphs"] = counters["stats"]["unique_graphs"] - graphs
    # O0 + apex-ddp + SyncBN on half batches: the test compares with one process. The
    # samples are dealt in order (rank r takes r, r + 2, ...: its half of each batch of
    # 32); Lightning's own sampler would shuffle them.
    ds = cases.dataset()
    dealt = torch.utils.data.DataLoader(ds, batch_size=16, sampler=torch.utils.data.DistributedSampler(
        ds, num_replicas=2, rank=rank, shuffle=False))
    fit(pl, "o0_syncbn", results, model=Net(seed=0), precision="apex-O0", strategy="apex-ddp",
        sync_batchnorm=True, max_epochs=1, data=dealt, use_distributed_sampler=False)
    # Accumulation: no collective on the accumulating micro-batches.
    with cases.AllReduceCounter() as counter:
        fit(pl, "accumulate", results, model=Net(seed=10 + rank, counter=counter), precision="apex-O2-bf16",
            strategy="apex-ddp", accumulate_grad_batches=2, max_epochs=1)
    # Resume: an interrupted run continues exactly as the uninterrupted one.
    ckpt = Path(out) / "epoch1.ckpt"
    fit(pl, "whole", results, model=Net(seed=10 + rank, optimizer="fused_adam"), precision="apex-O2",
        strategy="apex-ddp", max_epochs=2)
    trainer, _ = fit(pl, "first", results, model=Net(seed=10 + rank, optimizer="fused_adam"),
                     precision="apex-O2", strategy="apex-ddp", max_epochs=1)
    trainer.save_checkpoint(ckpt)
    fit(pl, "resumed", results, model=Net(seed=99, optimizer="fused_adam"), precision="apex-O2",
        strategy="apex-ddp", max_epochs=2, ckpt_path=ckpt)
    # Lightning's own DDP with Apex's precision; apex-ddp with Lightning's precision;
    # manual optimization.
    fit(pl, "torch_ddp", results, precision="apex-O2", strategy="ddp", max_epochs=1)
    fit(pl, "lightning_precision", results, precision="bf16-mixed", strategy="apex-ddp", max_epochs=1)
    fit(pl, "manual", results, model=Net(seed=10 + rank, manual=True), precision="apex-O2-bf16",
        strategy="apex-ddp", max_epochs=1)
    return results


def fabric_suite(out):
    import lightning as L
    fabric = L.Fabric(precision="apex-O2", strategy="apex-ddp", accelerator="cpu", devices=2)
    fabric.launch()
    rank = fabric.global_rank
    results = {}

    def setup(seed):
        model = cases.conv_net(seed)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, opt = fabric.setup(model, opt)
        return model, opt

    def train(model, opt, batches, inf_at=None, record=None):
        for i, (x, y) in enumerate(batches):
            with fabric.no_backward_sync(model, enabled=(i % 2 == 0)):  # 2 micro-batches a step
                loss = F.cross_entropy(model(x), y)
                if inf_at == (i, rank):
                    loss = loss * float("inf")
                fabric.backward(loss)
            if i % 2 == 1:
                norm = fabric.clip_gradients(model, opt, max_norm=0.5)
                opt.step()
                opt.zero_grad()
                if record is not None:
                    record.append(dict(params=cases.flat(model.parameters()), norm=float(norm),
                                       skipped=fabric.strategy.precision.step_was_skipped(opt)))

    batches = [(x, y) for x, y in cases.loader(batch=8)]
    local = batches[rank::2]  # each rank its own micro-batches
    amp = fabric.strategy.precision
    fresh = copy.deepcopy(amp.state_dict())  # every run below starts from the first scale
    model, opt = setup(10 + rank)
    record = []
    with cases.AllReduceCounter() as counter:
        before = counter.count
        with fabric.no_backward_sync(model):
            fabric.backward(F.cross_entropy(model(local[0][0]), local[0][1]))
        results["collectives_inside_no_sync"] = counter.count - before
        opt.zero_grad()
    train(model, opt, local, inf_at=(2, 1), record=record)
    results["train"] = record
    results["dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    # save / load with the precision plugin in the state: resumes exactly.
    path = Path(out) / "fabric.ckpt"
    amp.load_state_dict(fresh)
    whole_model, whole_opt = setup(20 + rank)
    train(whole_model, whole_opt, local)
    amp.load_state_dict(fresh)
    first_model, first_opt = setup(20 + rank)
    train(first_model, first_opt, local[:4])
    fabric.save(path, {"model": first_model, "optimizer": first_opt, "amp": amp})
    fabric.barrier()
    resumed_model, resumed_opt = setup(77)
    fabric.load(path, {"model": resumed_model, "optimizer": resumed_opt, "amp": amp})
    train(resumed_model, resumed_opt, local[4:])
    amp.load_state_dict(fresh)  # the whole run again, the model compiled before fabric.setup
    compiled_model = torch.compile(cases.conv_net(20 + rank), backend="aot_eager")
    compiled_model, compiled_opt = fabric.setup(compiled_model, torch.optim.SGD(compiled_model.parameters(), lr=0.05,
                                                                                momentum=0.9))
    train(compiled_model, compiled_opt, local)
    results["compiled"] = cases.flat(compiled_model.parameters())
    results["whole"] = cases.flat(whole_model.parameters())
    results["resumed"] = cases.flat(resumed_model.parameters())
    results["rank"] = rank
    results["saved_dtypes"] = sorted({str(v.dtype) for v in torch.load(path, weights_only=False)["model"].values()
                                      if v.is_floating_point()})
    return results


def _spawned(fabric, out, strategy):
    """One spawned rank of fabric_spawn (the plugin and the strategy went by pickle)."""
    model = cases.conv_net(fabric.global_rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = fabric.setup(model, opt)
    for x, y in cases.loader():
        fabric.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
    torch.save(dict(params=cases.flat(model.parameters()), precision=type(fabric.strategy.precision).__name__,
                    dtypes=sorted({str(p.dtype) for p in model.parameters()})),
               Path(out) / f"fabric_spawn-{strategy}-rank{fabric.global_rank}.pt")
    leave_process_group()


def standalone_fsdp(pl):
    """pytorch_lightning's Trainer with strategy="apex-fsdp": the tree's own classes."""
    from core_ops.optimizers import FusedAdam

    class Blocks(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.body(x).float(), y)
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self):
            return FusedAdam(self.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g))
    model = Blocks()
    trainer = pl.Trainer(**trainer_kwargs(precision="apex-O2-bf16", strategy="apex-fsdp", max_epochs=3))
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    strategy = type(trainer.strategy)
    return dict(strategy=f"{strategy.__module__}.{strategy.__name__}", losses=torch.stack(model.losses),
                types=sorted({type(p).__name__ for p in model.parameters()}),
                dtypes=sorted({str(p.dtype) for p in model.parameters()}))


def main():
    suite, out = sys.argv[1], sys.argv[2]
    if suite == "fabric_spawn":
        import functools

        import lightning as L

        import core_ops_lightning  # noqa: F401
        for strategy in ("apex-ddp_spawn", "ddp_spawn"):
            fabric = L.Fabric(precision="apex-O2", strategy=strategy, accelerator="cpu", devices=2)
            fabric.launch(functools.partial(_spawned, out=out, strategy=strategy))
        # The Trainer's spawn strategy too: the main process gets rank 0's weights back.
        import lightning.pytorch as pl
        model = cases.LightningNet(seed=5)
        before = cases.flat(model.parameters())
        pl.Trainer(**trainer_kwargs(precision="apex-O2", strategy="apex-ddp_spawn", max_epochs=1)).fit(
            model, cases.loader())
        torch.save(dict(before=before, after=cases.flat(model.parameters()),
                        dtypes=sorted({str(p.dtype) for p in model.parameters()})),
                   Path(out) / "trainer_spawn.pt")
        return
    if suite == "fabric":
        import core_ops_lightning  # noqa: F401
        results = fabric_suite(out)
    else:
        import core_ops_lightning  # noqa: F401
        if suite == "standalone":
            import pytorch_lightning as pl
        else:
            import lightning.pytorch as pl
        results = trainer_suite(pl, out) if suite == "trainer" else {}
        if suite == "standalone":
            fit(pl, "o2", results, precision="apex-O2", strategy="apex-ddp", sync_batchnorm=True, max_epochs=1)
            results["fsdp"] = standalone_fsdp(pl)
    torch.save(results, Path(out) / f"{suite}-rank{results['rank']}.pt")


if __name__ == "__main__":
    main()
    leave_process_group()
