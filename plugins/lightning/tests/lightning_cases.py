"""The LightningModule the Lightning plugin tests share, in-process and in the launched
runs (ddp_runs.py), on the small task of tests/support/small_task.py."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
from small_task import AllReduceCounter, conv_net, dataset, flat, loader  # noqa: E402, F401


def make_module(pl):
    """The LightningModule class for the ``pl`` tree (lightning.pytorch or pytorch_lightning)."""

    class Net(pl.LightningModule):
        """Records, per step, the params after it, the lr and what the plugin logged.
        ``inf_at=(step, rank)`` makes that rank's loss inf at that step; ``manual``
        trains with manual optimization."""

        def __init__(self, seed=0, lr=0.05, inf_at=None, manual=False, optimizer="sgd", counter=None):
            super().__init__()
            self.net = conv_net(seed)
            self.lr, self.inf_at, self.optimizer_name, self.counter = lr, inf_at, optimizer, counter
            self.automatic_optimization = not manual
            self.history, self.backward_collectives = [], []

        def forward(self, x):
            return self.net(x)

        def _loss(self, batch):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            if self.inf_at == (self.global_step, self.global_rank):
                loss = loss * float("inf")
            return loss

        def training_step(self, batch, batch_idx):
            if self.counter is not None:
                self._before = self.counter.count
            loss = self._loss(batch)
            self._log_loss(loss)
            if not self.automatic_optimization:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                return None
            return loss

        # Logging is eager bookkeeping, kept out of a compiled step: dynamo in torch 2.12
        # and 2.13 fails tracing Lightning 2.6's self.log of a torch.compile'd module
        # ("'method' object has no attribute '__dict__'", Lightning-AI/pytorch-lightning#21836,
        # plain Lightning too); Lightning's fix (#21837) disables compile the same way.
        @torch.compiler.disable
        def _log_loss(self, loss):
            self.log("train_loss", loss, prog_bar=True)

        def on_after_backward(self):
            if self.counter is not None:
                self.backward_collectives.append(self.counter.count - self._before)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            metrics = self.trainer.callback_metrics
            self.history.append(dict(
                step=self.global_step, params=flat(self.parameters()),
                lr=self.trainer.optimizers[0].param_groups[0]["lr"],
                loss_scale=float(metrics.get("loss_scale", float("nan"))),
                skipped=float(metrics.get("skipped_steps", float("nan")))))

        def configure_optimizers(self):
            if self.optimizer_name == "fused_adam":
                from core_ops.optimizers import FusedAdam
                opt = FusedAdam(self.parameters(), lr=self.lr / 10)
            else:
                opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Net


def __getattr__(name):
    """``LightningNet``: make_module(lightning.pytorch) under a name pickle can find again,
    for strategies that spawn their ranks and send them the module."""
    if name != "LightningNet":
        raise AttributeError(name)
    import lightning.pytorch as pl
    cls = make_module(pl)
    cls.__name__ = cls.__qualname__ = name
    globals()[name] = cls
    return cls


def assert_steps_equal(eager, compiled, scale="loss_scale", steps=4):
    """A compiled run's per-step records against the eager run's: params and loss scale
    bit for bit (the same kernels run), and the loss where it was recorded and finite."""
    assert len(eager) == len(compiled) == steps
    for a, b in zip(eager, compiled):
        assert torch.equal(a["params"], b["params"]) and a[scale] == b[scale], a["step"]
        if "loss" in a:
            assert torch.equal(a["loss"], b["loss"]) or not torch.isfinite(a["loss"]), a["step"]
