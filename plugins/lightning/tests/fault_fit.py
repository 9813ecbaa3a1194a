"""A Trainer run for test_lightning_faults.py: apex-O2-bf16 + apex-ddp on 2 gloo processes, a
checkpoint (last.ckpt) after every epoch of one step, 6 epochs; the final params go to
OUT/final-rank<R>.pt.

    python fault_fit.py OUT [--kill EPOCH] [--resume] [--fsdp]

``--kill E``: rank 1 SIGKILLs itself in epoch E before its backward (a lost process
mid-step); rank 0 (Lightning's launcher, which started rank 1) must stop with an error.
``--resume``: ``trainer.fit(..., ckpt_path="last")``. ``--fsdp``: ``strategy="apex-fsdp"``
(checkpoints are torch.distributed.checkpoint folders).
"""

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

import core_ops_lightning  # noqa: F401  (the apex-* names)

EPOCHS = 6


class Net(pl.LightningModule):
    def __init__(self, kill_at=None):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 3))
        self.kill_at = kill_at

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.body(x).float(), y)

    def on_before_backward(self, loss):
        if (self.current_epoch, self.global_rank) == (self.kill_at, 1):
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self):
        from core_ops.optimizers import FusedAdam
        return FusedAdam(self.parameters(), lr=1e-2)


def main():
    out = Path(sys.argv[1])
    kill = int(sys.argv[sys.argv.index("--kill") + 1]) if "--kill" in sys.argv else None
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(32, 12, generator=g), torch.randn(32, 3, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=16)  # 2 ranks x 16: one step an epoch
    saving = pl.callbacks.ModelCheckpoint(dirpath=out, save_last=True, save_top_k=-1, every_n_epochs=1)
    strategy = "apex-fsdp" if "--fsdp" in sys.argv else "apex-ddp"
    trainer = pl.Trainer(accelerator="cpu", devices=2, precision="apex-O2-bf16", strategy=strategy,
                         max_epochs=EPOCHS, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[saving])
    model = Net(kill_at=kill)
    trainer.fit(model, loader, ckpt_path="last" if "--resume" in sys.argv else None)
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in model.parameters()]
    torch.save(whole, out / f"final-rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
