"""core-ops' demo: a small convolutional network with BatchNorm learns scikit-learn's
handwritten digits (1797 8x8 images, 10 classes, shipped with the package) under
Lightning, first with Apex's O2 and core_ops' DistributedDataParallel, then with plain
Lightning for comparison, and ends with one table:

    python plugins/lightning/examples/digits.py [--epochs 10] [--devices 2] [--plot loss.png]

On a machine without GPUs it runs 2 CPU processes (gloo); with GPUs, one process per GPU
(up to --devices). Each configuration is a real ``Trainer.fit`` with its progress bar:

    apex-O2 + apex-ddp       fp16 model, BatchNorm fp32, fp32 master weights, dynamic loss
                             scaling, SyncBatchNorm, core_ops' bucketed allreduce
    apex-O0 + apex-ddp       the same strategy in float32
    32-true + ddp            plain Lightning, float32
    bf16-mixed + ddp         plain Lightning, torch.autocast(bfloat16)
"""

import argparse
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

import core_ops_lightning  # noqa: F401  (registers apex-O2 and apex-ddp)

RUNS = [("apex-O2", "apex-ddp"), ("apex-O0", "apex-ddp"), ("32-true", "ddp"), ("bf16-mixed", "ddp")]


def digits(seed=0):
    """(train, test) TensorDatasets: 80% / 20% of the digits, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return (torch.utils.data.TensorDataset(x[train], y[train]),
            torch.utils.data.TensorDataset(x[test], y[test]))


class DigitNet(pl.LightningModule):
    def __init__(self, lr=3e-3):
        super().__init__()
        torch.manual_seed(0)
        block = lambda i, o: [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]  # noqa: E731
        self.net = nn.Sequential(*block(1, 32), *block(32, 32), nn.MaxPool2d(2), *block(32, 64),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x).float()
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.lr, total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Record(pl.Callback):
    """The training time and the loss of every step (rank 0)."""

    def __init__(self):
        self.losses, self.seconds = [], 0.0

    def on_train_epoch_start(self, trainer, module):
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.seconds += time.perf_counter() - self._t0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def run(precision, strategy, args, train, test):
    record = Record()
    gpus = torch.cuda.device_count()
    # torch's SyncBatchNorm (plain Lightning's) runs on GPUs only; core_ops' anywhere.
    sync_bn = bool(gpus) or strategy.startswith("apex")
    trainer = pl.Trainer(precision=precision, strategy=strategy, sync_batchnorm=sync_bn,
                         accelerator="gpu" if gpus else "cpu", devices=min(args.devices, gpus) if gpus else args.devices,
                         max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, callbacks=[record], num_sanity_val_steps=0)
    if trainer.global_rank == 0:
        print(f"\n=== precision={precision!r}, strategy={strategy!r} ===", flush=True)
    model = DigitNet()
    loader = lambda ds, shuffle: torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=shuffle)  # noqa: E731
    trainer.fit(model, loader(train, True), loader(test, False))
    metrics = trainer.callback_metrics
    return dict(run=f"{precision} + {strategy}", sync_bn=sync_bn, accuracy=float(metrics["val_acc"]), loss=float(metrics["val_loss"]),
                samples_per_s=args.epochs * len(train) / record.seconds,
                skipped=int(metrics.get("skipped_steps", 0)), losses=record.losses, rank=trainer.global_rank,
                world=trainer.world_size)


def table(results):
    rows = ["| run | SyncBatchNorm | test accuracy | test loss | samples/s (all ranks) | skipped steps |",
            "|---|---|---:|---:|---:|---:|"]
    rows += [f"| {r['run']} | {'yes' if r['sync_bn'] else 'no (GPU only)'} | {100 * r['accuracy']:.1f}% "
             f"| {r['loss']:.3f} | {r['samples_per_s']:.0f} | {r['skipped']} |" for r in results]
    return "\n".join(rows)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot(r["losses"], label=r["run"], linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (rank 0's batches)")
    ax.set_title("scikit-learn digits, small CNN with BatchNorm")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--devices", type=int, default=2, help="processes (CPU) or GPUs")
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--plot", metavar="PNG", help="write the loss curves to this file")
    p.add_argument("--runs", default=",".join(f"{a}:{b}" for a, b in RUNS),
                   help="precision:strategy pairs, comma-separated")
    args = p.parse_args()
    torch.set_num_threads(1)  # one core per process
    train, test = digits()
    results = [run(*pair.split(":"), args, train, test) for pair in args.runs.split(",")]
    if results[0]["rank"] == 0:
        world = results[0]["world"]
        print(f"\nscikit-learn digits: {len(train)} training and {len(test)} test images, "
              f"{args.epochs} epochs, {world} process(es) x {args.batch_size} per batch\n")
        print(table(results))
        if not torch.cuda.is_available():
            print("\n(On a CPU without native fp16 / bf16 arithmetic, half precision computes slower "
                  "than float32: compare the samples/s of the float32 runs, and the half runs on a GPU.)")
        if args.plot:
            plot(results, args.plot)
            print(f"\nloss curves: {args.plot}")


if __name__ == "__main__":
    main()
