"""What the Lightning plugin costs, in the same run, medians of per-step times:

    python bench/bench_lightning.py [--repeats 3] [--steps 40]

  O2 Trainer step   a Trainer step under precision="apex-O2" against the same model and
                    batches in a hand-written core_ops.amp O2 loop (amp.initialize +
                    scale_loss + step), one process                   target <= 1.05 x
  O0 + apex-ddp     a Trainer step under apex-O0 + apex-ddp against Lightning's own
                    32-true + ddp, 2 gloo processes x 1 thread        target <= 1.0 x

A step is timed from on_train_batch_start to on_train_batch_end (forward, backward,
optimizer step, Lightning's hooks; not the data loading), the hand-written loop over
the same work. The runs alternate (A, B, A, B, ...) and the ratio is the median over
the alternations of each pair's ratio of median step times (the medians in the table
pool every run); the first 5 steps of each run are warm-up and left out. The DDP case runs in a child launched
with ``--case ddp``, which Lightning's launcher starts again for rank 1.
"""

import statistics
import sys
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

import core_ops_lightning  # noqa: F401  (apex-* names)
import harness
from core_ops import amp

WARMUP = 5


def conv_net():
    torch.manual_seed(0)
    block = lambda i, o: [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]  # noqa: E731
    return nn.Sequential(*block(3, 32), *block(32, 32), nn.MaxPool2d(2), *block(32, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def mlp():
    torch.manual_seed(0)
    widths = [512, 2048, 2048, 512]  # 5.2M params: the allreduce matters
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))


def batches(steps, shape, batch):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, *shape, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


class Module(pl.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.times = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def on_train_batch_start(self, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.times.append((time.perf_counter() - self._t0) * 1e3)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def trainer_run(net, data, **kw):
    model = Module(net)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", **kw)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=None))
    return model.times[WARMUP:], trainer


def hand_written_o2(net, data):
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    net, opt = amp.initialize(net, opt, opt_level="O2", verbosity=0)
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[WARMUP:]


def paired(rows_of_runs, case, baseline, target):
    """The row of ``[(baseline run times, core_ops run times), ...]``, its ratio the
    median over the alternations of each pair's ratio of medians: this machine's speed
    drifts by 10-20% between runs a few seconds apart, which a pair shares."""
    base = [t for b, _ in rows_of_runs for t in b]
    core = [t for _, c in rows_of_runs for t in c]
    row = harness.row(case, baseline, base, core, target)
    row["ratio"] = statistics.median(statistics.median(c) / statistics.median(b) for b, c in rows_of_runs)
    row["passed"] = row["ratio"] <= target
    return row


def case_o2(args):
    data = batches(args.steps, (3, 8, 8), 32)
    runs = []
    for _ in range(args.repeats):
        runs.append((hand_written_o2(conv_net(), data),
                     trainer_run(conv_net(), data, precision="apex-O2", devices=1)[0]))
    return paired(runs, "O2 Trainer step", "hand-written amp O2 loop", 1.05)


def case_ddp(args):
    """Rank 0 prints its row; Lightning re-runs this for rank 1."""
    data = batches(args.steps, (512,), 32)
    runs, rank = [], 0
    for _ in range(args.repeats):
        pair = []
        for precision, strategy in (("32-true", "ddp"), ("apex-O0", "apex-ddp")):
            times, trainer = trainer_run(mlp(), data, precision=precision, strategy=strategy, devices=2,
                                         use_distributed_sampler=False)
            pair.append(times)
            rank = trainer.global_rank
        runs.append(tuple(pair))
    if rank == 0:
        harness.emit_row(paired(runs, "O0 + apex-ddp, 2 ranks", "32-true + ddp", 1.0))


def main():
    harness.framework_main(__doc__, case_o2, case_ddp, [sys.executable], {}, "O0 + apex-ddp, 2 ranks",
                           "32-true + ddp", WARMUP)


if __name__ == "__main__":
    main()
