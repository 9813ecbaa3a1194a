"""The Lightning plugin in one process (real Trainer and Fabric runs on the CPU): every
name trains, the Trainer and Fabric give what a hand-written AmpLoop gives on the same
model and data, checkpoints hold fp32 weights, and bad input fails at construction."""

import copy

import lightning as L
import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

import core_ops_lightning
from core_ops.amp import AmpLoop
from core_ops_lightning import NAMES, ApexPrecision
from lightning_cases import conv_net, flat, loader, make_module

Net = make_module(pl)
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
             enable_progress_bar=False, enable_model_summary=False)


def fit(precision=None, plugins=None, epochs=1, model=None, **kw):
    model = model or Net(seed=0)
    trainer = pl.Trainer(precision=precision, plugins=plugins, max_epochs=epochs, **QUIET, **kw)
    trainer.fit(model, loader())
    return trainer, model


@pytest.mark.parametrize("name", list(NAMES))
def test_every_name_trains(name):
    trainer, model = fit(name, epochs=3)
    losses = [h for h in model.history]
    assert trainer.precision == name
    first, last = model.history[0], model.history[-1]
    assert not torch.equal(first["params"], last["params"])
    assert float(trainer.callback_metrics["train_loss"]) < 1.2  # from ~1.4: it learns
    level, half = NAMES[name]
    weights = {p.dtype for p in model.net[0].parameters()}
    assert weights == ({half} if level in ("O2", "O3") else {torch.float32})
    assert model.net[1].weight.dtype == (half if level == "O3" else torch.float32)  # BatchNorm kept at O2
    assert losses


def hand_written(opt_level, half_dtype, clip, torch_clip=False):
    """The same training as Net under the Trainer, with AmpLoop by hand (clipping with
    torch's clip_grad_norm_ where Lightning's own strategies clip so)."""
    loop = AmpLoop(opt_level, half_dtype=half_dtype)
    model = Net(seed=0)
    loop.prepare_model(model)
    opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    sched = loop.follow_skips(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95))
    for x, y in loader():
        with loop.autocast("cpu"):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loop.scale(loss).backward()
        loop.unscale_(opt)
        if clip and torch_clip:
            loop.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], clip)
        elif clip:
            loop.clip_grad_norm_(opt, clip)
        loop.step(opt)
        loop.update()
        sched.step()
    return model, loop


@pytest.mark.parametrize("name", ["apex-O1", "apex-O2", "apex-O2-bf16", "apex-O3"])
def test_the_trainer_trains_as_a_hand_written_loop(name):
    """Bit for bit: the plugin adds no numerics (clipping by norm included)."""
    trainer, model = fit(name, gradient_clip_val=0.5)
    theirs, loop = hand_written(*NAMES[name], clip=0.5)
    assert torch.equal(flat(model.parameters()), flat(theirs.parameters()))
    assert trainer.precision_plugin.loss_scale == loop.loss_scale
    assert trainer.callback_metrics.get("skipped_steps", 0) == loop.skipped_steps  # O3: no scaling, no log


def test_fabric_trains_as_a_hand_written_loop():
    fabric = L.Fabric(precision="apex-O2", accelerator="cpu", devices=1)
    model = Net(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95)
    model, opt, sched = fabric.setup(model, opt, scheduler=sched)
    for x, y in loader():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        fabric.backward(loss)
        fabric.clip_gradients(model, opt, max_norm=0.5, error_if_nonfinite=False)
        opt.step()
        sched.step()
    # Fabric's single-device strategy clips with torch's clip_grad_norm_ (apex-ddp's
    # with core_ops'); the Fabric plugin unscales at the clip.
    theirs, loop = hand_written("O2", torch.float16, clip=0.5, torch_clip=True)
    assert torch.equal(flat(model.parameters()), flat(theirs.parameters()))
    assert fabric.strategy.precision.skipped_steps == loop.skipped_steps


def test_the_checkpoint_holds_fp32_weights_for_a_plain_module(tmp_path):
    trainer, model = fit("apex-O2")
    path = tmp_path / "o2.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)  # no pickled classes: the plugin's entries included
    assert {v.dtype for k, v in saved["state_dict"].items() if v.is_floating_point()} == {torch.float32}
    assert saved["ApexPrecision"]["opt_level"] == "O2"
    plain = Net.load_from_checkpoint(path)  # no plugin: a float32 module for inference
    assert {p.dtype for p in plain.parameters()} == {torch.float32}
    masters = [m for g in trainer.optimizers[0].param_groups for m in g["params"]]
    assert torch.equal(flat(plain.parameters()), flat(masters))


def test_instance_form_and_the_other_tree():
    """ApexPrecision takes initialize's options; one made for lightning works in
    pytorch_lightning's Trainer and in Fabric (rebuilt there with its options)."""
    plugin = ApexPrecision("O2", half_dtype=torch.bfloat16, loss_scale=128.0)
    trainer, model = fit(plugins=[plugin])
    assert trainer.precision == "apex-O2-bf16" and trainer.precision_plugin.loss_scale == 128.0
    import pytorch_lightning
    from core_ops_lightning.pytorch_lightning import ApexPrecision as StandaloneApex
    other = pytorch_lightning.Trainer(plugins=[plugin], max_epochs=1, **QUIET)
    assert isinstance(other.precision_plugin, StandaloneApex)
    assert other.precision_plugin.options == plugin.options
    fabric = L.Fabric(plugins=[plugin], accelerator="cpu", devices=1)
    from core_ops_lightning.fabric import ApexPrecision as FabricApex
    assert isinstance(fabric.strategy.precision, FabricApex)
    import lightning_fabric

    import core_ops_lightning.lightning_fabric
    assert isinstance(lightning_fabric.Fabric(precision="apex-O3", accelerator="cpu").strategy.precision,
                      core_ops_lightning.lightning_fabric.ApexPrecision)


def test_manual_optimization_trains():
    trainer, model = fit("apex-O2-bf16", model=Net(seed=0, manual=True), epochs=2)
    assert float(trainer.callback_metrics["train_loss"]) < 1.3
    assert trainer.precision_plugin.skipped_steps == 0


def test_fused_optimizer_with_clipping_and_accumulation():
    trainer, model = fit("apex-O2", model=Net(seed=0, optimizer="fused_adam"), epochs=2,
                         gradient_clip_val=1.0, accumulate_grad_batches=2)
    assert trainer.global_step == 8  # 8 batches an epoch, 2 per step
    assert not torch.equal(model.history[0]["params"], model.history[-1]["params"])


def test_bad_input_fails_at_construction():
    with pytest.raises(ValueError, match="unknown precision 'apex-O7'; core_ops_lightning's are apex-O0, apex-O1"):
        pl.Trainer(precision="apex-O7", **QUIET)
    with pytest.raises(ValueError, match="unknown precision 'apex-O7'"):
        L.Fabric(precision="apex-O7")
    # Near misses of ours get our names, not only Lightning's list.
    for given, meant in (("apex_O2_bf16", "apex-O2-bf16"), ("O2-bf16", "apex-O2-bf16"), ("APEX-o1", "apex-O1")):
        with pytest.raises(ValueError, match=f"precision='{given}'\\): did you mean '{meant}'\\? core_ops_lightning's"):
            pl.Trainer(precision=given, **QUIET)
    with pytest.raises(ValueError, match="did you mean 'apex-O3'"):
        L.Fabric(precision="apex_O3")
    with pytest.raises(ValueError, match="both set the precision; give one of them"):
        pl.Trainer(precision="apex-O2", plugins=[pl.plugins.MixedPrecision("bf16-mixed", "cpu")], **QUIET)
    with pytest.raises(ValueError, match="both set the precision"):
        pl.Trainer(precision="apex-O2", plugins=[ApexPrecision("O1")], **QUIET)
    # FSDP, DeepSpeed and XLA refuse this CPU machine by themselves; ModelParallel does not.
    # The Trainer runs it (the model is sharded in configure_model, before amp casts it);
    # Fabric would cast first, so it is refused there, naming the route.
    pl.Trainer(plugins=[ApexPrecision("O2")], strategy=pl.strategies.ModelParallelStrategy(),
               **dict(QUIET, devices=2))
    with pytest.raises(ValueError, match="Fabric\\(precision='apex-O3'\\) cannot run with ModelParallelStrategy.*'apex-fsdp'"):
        L.Fabric(precision="apex-O3", strategy=L.fabric.strategies.ModelParallelStrategy(lambda m, _: m),
                 accelerator="cpu", devices=2)
    with pytest.raises(TypeError, match=r"ApexPrecision got unknown option loss_scal \(did you mean loss_scale\?\)"):
        ApexPrecision("O2", loss_scal=4)
    with pytest.raises(TypeError, match="arguments of torch's DistributedDataParallel"):
        core_ops_lightning.ApexDDPStrategy(bucket_cap_mb=25)
    with pytest.raises(TypeError, match="ApexFSDPStrategy: auto_wrap_policy takes a set of nn.Module classes"):
        core_ops_lightning.ApexFSDPStrategy(auto_wrap_policy=lambda m: True)
    with pytest.raises(TypeError, match="takes no tensor_parallel_size"):
        core_ops_lightning.ApexFSDPStrategy(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="ApexFSDPStrategy: reduce_dtype must be one of"):
        core_ops_lightning.ApexFSDPStrategy(reduce_dtype=torch.int8)
    with pytest.raises(TypeError, match=r"ApexFSDPStrategy: cpu_offload takes True, False or an FSDP2 OffloadPolicy"):
        core_ops_lightning.ApexFSDPStrategy(cpu_offload="cpu")
    # True on a machine without CUDA: not pinned (pinning needs a CUDA driver).
    policy = core_ops_lightning.ApexFSDPStrategy(cpu_offload=True).apex_fsdp.cpu_offload
    assert type(policy).__name__ == "CPUOffloadPolicy" and policy.pin_memory == torch.cuda.is_available()
    with pytest.raises(ValueError, match="message_size=0: expected an int > 0"):
        core_ops_lightning.ApexDDPStrategy(message_size=0)


def test_the_patch_is_idempotent_and_undone():
    from core_ops_lightning import _compat, _trees
    trees = _trees.ALL
    connector = next(iter(trees)).trainer_connector
    wrapped = connector.__init__
    assert _compat.install(trees) == [] and connector.__init__ is wrapped  # again: nothing more
    _compat.uninstall(trees)
    try:
        assert not getattr(connector.__init__, _compat._MARK, False)
        with pytest.raises(ValueError, match="Precision 'apex-O2' is invalid"):
            pl.Trainer(precision="apex-O2", **QUIET)
        assert "apex-ddp" not in pl.strategies.StrategyRegistry
    finally:
        assert _compat.install(trees) == []
    assert "apex-ddp" in pl.strategies.StrategyRegistry and copy.copy(connector.__init__) is connector.__init__


def test_an_unknown_lightning_is_left_unpatched_and_the_import_says_so(monkeypatch):
    """Where a probe fails nothing is patched (never half a patch) and install reports
    why (the package's import warns with it, pointing to plugins=[...])."""
    from core_ops_lightning import _compat, _trees
    _compat.uninstall(_trees.ALL)
    try:
        monkeypatch.setattr(_compat, "problems", lambda tree: [f"{tree.name} 9.9 is outside the supported range"])
        assert _compat.install(_trees.ALL) == ["lightning 9.9 is outside the supported range",
                                               "pytorch_lightning 9.9 is outside the supported range"]
        assert not any(getattr(t.trainer_connector.__init__, _compat._MARK, False) for t in _trees.ALL)
        assert "apex-ddp" not in pl.strategies.StrategyRegistry
        trainer, _ = fit(plugins=[ApexPrecision("O2")])  # the objects still work
        assert trainer.precision == "apex-O2"
    finally:
        monkeypatch.undo()
        assert _compat.install(_trees.ALL) == []


class _Recorder(pl.loggers.Logger):
    """The metrics dicts Lightning sends to a logger, with their steps."""

    def __init__(self):
        super().__init__()
        self.sent = []

    name, version = "recorder", 0

    def log_metrics(self, metrics, step=None):
        self.sent.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs):
        pass


def test_the_loss_scale_is_logged_on_logging_steps_only():
    # Lightning's log() is about 1,900 Python calls: the plugin logs loss_scale and
    # skipped_steps on the steps whose on_step metrics go to the loggers, and on an
    # epoch's last batch, not on every step (it doubled a small model's host time).
    calls = []
    model = Net(seed=0)
    log = model.log
    model.log = lambda name, *a, **k: (calls.append(name), log(name, *a, **k))[1]
    recorder = _Recorder()
    quiet = {**QUIET, "logger": recorder}
    trainer = pl.Trainer(precision="apex-O2-bf16", max_epochs=1, log_every_n_steps=3, **quiet)
    trainer.fit(model, loader())  # 8 steps
    steps = len(model.history)
    sent = [m for _, m in recorder.sent if "train_loss" in m]
    assert steps == 8 and len(sent) == 2  # steps 3 and 6
    assert all(m["loss_scale"] == 2.0**16 and m["skipped_steps"] == 0 for m in sent)  # O2's dynamic scale
    assert calls.count("loss_scale") == calls.count("skipped_steps") == 3  # steps 3, 6 and the last
    assert calls.count("train_loss") == steps
    assert float(trainer.callback_metrics["loss_scale"]) == 2.0**16


def test_remainders_train_as_fp32_masters():
    """ApexPrecision("O2", bf16, master_weights="remainder"): the Trainer steps FusedAdam on
    bfloat16 params plus remainders, bit for bit the fp32-master run."""
    runs = []
    for master_weights in (True, "remainder"):
        precision = ApexPrecision("O2", half_dtype=torch.bfloat16, master_weights=master_weights)
        trainer, model = fit(plugins=[precision], model=Net(seed=0, optimizer="fused_adam"))
        runs.append(model)
    assert torch.equal(flat(runs[0].parameters()), flat(runs[1].parameters()))
    opt = trainer.optimizers[0]
    halves = [p for p in runs[1].parameters() if p.dtype == torch.bfloat16]
    assert halves and all(opt.state[p]["master_remainder"].dtype == torch.int16 for p in halves)
    assert not any("master_param" in s for s in opt.state.values())


def test_a_checkpoint_of_compact_state_resumes_exactly(tmp_path):
    """Remainders and 8-bit moments through Lightning's checkpoint: one epoch, saved,
    resumed for a second in a fresh Trainer, is the two-epoch run bit for bit."""
    from core_ops.optimizers import FusedAdam

    class Compact(Net):
        def configure_optimizers(self):
            return FusedAdam(self.parameters(), lr=self.lr / 10, state_dtype="int8", min_8bit_size=64)

    def precision():
        return ApexPrecision("O2", half_dtype=torch.bfloat16, master_weights="remainder")

    _, straight = fit(plugins=[precision()], epochs=2, model=Compact(seed=0))
    trainer, first = fit(plugins=[precision()], epochs=1, model=Compact(seed=0))
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    state = trainer.optimizers[0].state
    assert any(s.get("exp_avg", torch.zeros(())).dtype == torch.uint8 for s in state.values())
    resumed = Compact(seed=1)
    pl.Trainer(plugins=[precision()], max_epochs=2, **QUIET).fit(resumed, loader(), ckpt_path=tmp_path / "one.ckpt")
    assert torch.equal(flat(straight.parameters()), flat(resumed.parameters()))


def test_a_compiled_module_trains_as_the_eager_one():
    """torch.compile(module) under apex-O2-bf16 (aot_eager: dynamo and AOTAutograd over
    core_ops' ops without inductor's codegen) trains bit for bit as eager."""
    runs = []
    for compiled in (False, True):
        torch._dynamo.reset()
        model = Net(seed=0)
        trainer = pl.Trainer(precision="apex-O2-bf16", max_epochs=1, **QUIET)
        trainer.fit(torch.compile(model, backend="aot_eager") if compiled else model, loader())
        runs.append(flat(model.parameters()))
    assert torch.equal(*runs)


@pytest.mark.parametrize("name", ["apex-O0", "apex-O3-bf16"])
def test_a_nan_step_is_skipped_by_default_at_the_static_levels(name):
    """skip_nonfinite is on in ApexPrecision: at O0 / O3 (a static scale of 1, where
    Apex checks nothing) the inf step is skipped, counted and logged, and training goes on."""
    trainer, model = fit(name, model=Net(seed=0, inf_at=(1, 0)), log_every_n_steps=1)
    h = model.history
    assert torch.equal(h[0]["params"], h[1]["params"]) and not torch.equal(h[1]["params"], h[2]["params"])
    assert torch.isfinite(h[-1]["params"]).all()
    assert trainer.precision_plugin.skipped_steps == 1 and h[1]["skipped"] == 1.0


class AlwaysNaN(Net):
    def _loss(self, batch):
        return super()._loss(batch) * float("nan")


def test_persistent_nan_stops_the_trainer_naming_the_grads():
    from core_ops.amp import NonFiniteTraining
    plugin = ApexPrecision("O3", half_dtype=torch.bfloat16, max_consecutive_skips=3)
    with pytest.raises(NonFiniteTraining, match=r"3 steps in a row .* net\.0\.weight \(8, 1, 3, 3\): 72 of 72"):
        fit(plugins=[plugin], model=AlwaysNaN(seed=0))


def test_skip_nonfinite_false_lets_the_nan_in_as_apex(monkeypatch):
    _, model = fit(plugins=[ApexPrecision("O3", half_dtype=torch.bfloat16, skip_nonfinite=False)],
                   model=Net(seed=0, inf_at=(1, 0)))
    assert not torch.isfinite(model.history[-1]["params"]).all()
    monkeypatch.setenv("CORE_OPS_SKIP_NONFINITE", "maybe")
    with pytest.raises(ValueError, match="CORE_OPS_SKIP_NONFINITE='maybe': expected one of 1, true"):
        ApexPrecision("O2")


def test_fabric_logs_the_loss_scale_and_skipped_steps_through_its_loggers(tmp_path):
    import csv
    from lightning.fabric.loggers import CSVLogger
    fabric = L.Fabric(precision="apex-O2", accelerator="cpu", devices=1,
                      loggers=CSVLogger(tmp_path, name="run", version=0))
    fabric.strategy.precision.log_every_n_steps = 2
    model = Net(seed=0)
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    for i, (x, y) in enumerate(loader()):  # 8 steps, the second overflows
        loss = F.cross_entropy(model(x), y) * (float("inf") if i == 1 else 1.0)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
    fabric.loggers[0].finalize("success")
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as f:
        rows = [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8]
    assert [float(r["skipped_steps"]) for r in rows] == [1.0] * 4
    assert float(rows[0]["loss_scale"]) == 2.0**15
