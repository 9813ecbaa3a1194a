"""Note [Settings that stop the run] under Lightning: a set CORE_OPS_* variable takes
effect in a real Trainer or Fabric run, or stops it saying what to write instead; a
near miss of a precision or strategy name is answered with ours; a skipped step says
so on the console."""

import lightning as L
import lightning.pytorch as pl
import pytest
import torch

from core_ops.optimizers import FusedAdam
from lightning_cases import flat, loader, make_module

Net = make_module(pl)
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
             enable_progress_bar=False, enable_model_summary=False)


class AdamWNet(Net):
    """configure_optimizers as most scripts write it: torch's AdamW and a step schedule."""

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit(model=None, **kw):
    model = model or Net(seed=0)
    trainer = pl.Trainer(max_epochs=1, **QUIET, **kw)
    trainer.fit(model, loader())
    return trainer, model


# ---- the three variables, each in a real run ------------------------------

def test_the_opt_level_variable_makes_the_precision_and_says_so(monkeypatch, capfd):
    monkeypatch.setenv("CORE_OPS_OPT_LEVEL", "O3")
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "bf16")
    trainer, model = fit()
    assert trainer.precision == "apex-O3-bf16"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not torch.equal(model.history[0]["params"], model.history[-1]["params"])
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("core-ops: ")]
    assert said[0].startswith("core-ops: every Trainer runs precision='apex-O3-bf16': ApexPrecision(opt_level=O3 "
                              "(CORE_OPS_OPT_LEVEL), half_dtype=bfloat16 (CORE_OPS_HALF_DTYPE), loss_scale=None, "), said
    assert "skip_nonfinite=True, max_consecutive_skips=50, skip_report_seconds=60.0, fused_optimizer=None" in said[0]


def test_a_bad_half_dtype_stops_the_trainer_naming_the_variable(monkeypatch):
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "float8")
    with pytest.raises(ValueError, match=r"^CORE_OPS_HALF_DTYPE='float8': expected fp16 or bf16"):
        pl.Trainer(**QUIET)
    with pytest.raises(ValueError, match=r"^CORE_OPS_HALF_DTYPE='float8': expected fp16 or bf16"):
        pl.Trainer(precision="apex-O2", **QUIET)


def test_a_half_dtype_without_an_opt_level_stops_the_run(monkeypatch):
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "bf16")
    with pytest.raises(ValueError, match=r"CORE_OPS_HALF_DTYPE='bf16' is set, but this Trainer runs Lightning's "
                                         r"default precision, so nothing would read it\. In Lightning, core-ops' "
                                         r"opt level is the precision: write Trainer\(precision='apex-O2-bf16'\)"):
        pl.Trainer(**QUIET)
    with pytest.raises(ValueError, match=r"this Fabric runs precision='bf16-mixed'"):
        L.Fabric(precision="bf16-mixed", accelerator="cpu", devices=1)


def test_remainders_from_the_variable_take_effect_with_torchs_adamw(monkeypatch):
    """CORE_OPS_MASTER_WEIGHTS=remainder with torch's AdamW: the Trainer steps its fused
    twin, which keeps the remainders (fused_optimizer left unset), its schedule with
    it, bit for bit the run that asks for FusedAdam with fp32 masters."""
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "remainder")
    trainer, model = fit(AdamWNet(seed=0), precision="apex-O2-bf16")
    opt = trainer.optimizers[0]
    assert isinstance(opt, FusedAdam) and opt.master_weights == "remainder"
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is opt
    assert model.history[-1]["lr"] == pytest.approx(1e-3 * 0.9 ** len(model.history))
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "1")
    monkeypatch.setenv("CORE_OPS_FUSED_OPTIMIZER", "1")
    _, masters = fit(AdamWNet(seed=0), precision="apex-O2-bf16")
    assert torch.equal(model.history[-1]["params"], masters.history[-1]["params"])


def test_remainders_with_an_optimizer_that_cannot_keep_them_name_the_variable(monkeypatch):
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "remainder")
    with pytest.raises(ValueError, match=r"CORE_OPS_MASTER_WEIGHTS='remainder' keeps the masters' lower halves .* "
                                         r"torch\.optim\.sgd\.SGD: use FusedAdam, or set CORE_OPS_MASTER_WEIGHTS=1"):
        fit(precision="apex-O2-bf16")


# ---- a variable against an argument ---------------------------------------------

def test_another_precision_with_the_opt_level_variable_stops_the_run(monkeypatch):
    monkeypatch.setenv("CORE_OPS_OPT_LEVEL", "O2")
    with pytest.raises(ValueError, match=r"CORE_OPS_OPT_LEVEL='O2' is set, but this Trainer runs "
                                         r"precision='bf16-mixed'.*write Trainer\(precision='apex-O2'\)"):
        pl.Trainer(precision="bf16-mixed", **QUIET)


def test_a_name_and_a_variable_that_disagree_stop_the_run(monkeypatch):
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "bf16")
    with pytest.raises(ValueError, match=r"precision='apex-O2' and CORE_OPS_HALF_DTYPE='bf16' disagree"):
        pl.Trainer(precision="apex-O2", **QUIET)
    assert pl.Trainer(precision="apex-O2-bf16", **QUIET).precision == "apex-O2-bf16"  # they agree


def test_the_ddp_variables_belong_to_apex_ddp(monkeypatch):
    monkeypatch.setenv("CORE_OPS_MESSAGE_SIZE", "4096")
    with pytest.raises(ValueError, match=r"CORE_OPS_MESSAGE_SIZE='4096' is set, but this Trainer runs "
                                         r"SingleDeviceStrategy, which does not read it: pass strategy='apex-ddp'"):
        pl.Trainer(**QUIET)
    trainer = pl.Trainer(strategy="apex-ddp", **QUIET)
    assert trainer.strategy.apex_ddp.message_size == 4096


def test_the_sync_bn_variable_is_the_trainers_sync_batchnorm(monkeypatch):
    monkeypatch.setenv("CORE_OPS_SYNC_BN", "1")
    trainer = pl.Trainer(strategy="apex-ddp", precision="apex-O2-bf16", **QUIET)
    assert type(trainer.strategy._layer_sync).__name__ == "CoreOpsSyncBatchNorm"
    monkeypatch.setenv("CORE_OPS_SYNC_BN", "0")
    with pytest.raises(ValueError, match=r"Trainer\(sync_batchnorm=True\) and CORE_OPS_SYNC_BN='0' disagree"):
        pl.Trainer(sync_batchnorm=True, **QUIET)
    with pytest.raises(ValueError, match="Fabric has no sync_batchnorm"):
        L.Fabric(accelerator="cpu", devices=1)


def test_fabric_takes_the_opt_level_variable(monkeypatch):
    monkeypatch.setenv("CORE_OPS_OPT_LEVEL", "O2")
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "bf16")
    fabric = L.Fabric(accelerator="cpu", devices=1)
    assert fabric._precision.precision == "apex-O2-bf16"


# ---- names -----------------------------------------------------------------------

@pytest.mark.parametrize("wrote, meant", [("apex-o2", "apex-O2"), ("apex-O2-fp16", "apex-O2"),
                                          ("apex_O2_bf16", "apex-O2-bf16"), ("O3-bf16", "apex-O3-bf16")])
def test_a_near_miss_of_a_precision_is_answered_with_ours(wrote, meant):
    with pytest.raises(ValueError, match=f"did you mean '{meant}'"):
        pl.Trainer(precision=wrote, **QUIET)


@pytest.mark.parametrize("wrote, meant", [("apex-dpp", "apex-ddp"), ("apex_ddp", "apex-ddp"),
                                          ("apex-fdsp", "apex-fsdp"), ("APEX-DDP_SPAWN", "apex-ddp_spawn")])
def test_a_near_miss_of_a_strategy_is_answered_with_ours(wrote, meant):
    with pytest.raises(ValueError, match=f"Trainer\\(strategy='{wrote}'\\): did you mean '{meant}'"):
        pl.Trainer(strategy=wrote, **QUIET)
    with pytest.raises(ValueError, match=f"Fabric\\(strategy='{wrote}'\\): did you mean '{meant}'"):
        L.Fabric(strategy=wrote, accelerator="cpu", devices=1)


def test_lightnings_own_names_pass():
    assert pl.Trainer(strategy="ddp", precision="bf16-mixed", **QUIET).precision == "bf16-mixed"


# ---- skipped steps ---------------------------------------------------------------

def test_a_skipped_step_is_said_on_the_console_and_counted_in_global_step(capfd):
    """fp16's dynamic scale skips the inf step; rank 0 prints one line (then at most one
    a minute) naming the culprit; global_step counts every optimizer call, skipped or
    not, as with torch's GradScaler under 16-mixed."""
    trainer, model = fit(Net(seed=0, inf_at=(2, 0)), precision="apex-O2-bf16")
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if "skipped for inf / nan grads" in line]
    assert len(said) == 1, err[-2000:]
    assert said[0].startswith("core-ops: 1 optimizer step skipped for inf / nan grads so far; loss scale now 32768; "
                              "this step: "), said
    assert "net.0.weight (8, 1, 3, 3): 72 of 72 non-finite" in said[0]
    assert said[0].endswith("(at most one such line each 60 s)")
    assert trainer.global_step == len(model.history) == len(loader())
    assert torch.equal(model.history[1]["params"], model.history[2]["params"])  # step 2 skipped
    assert torch.equal(flat(model.parameters()), model.history[-1]["params"])


def test_the_repr_shows_every_setting_in_effect_and_where_a_variable_gave_it(monkeypatch):
    from core_ops_lightning import ApexPrecision
    assert repr(ApexPrecision("O2")) == "ApexPrecision('O2', half_dtype=torch.float16)"
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "remainder")  # set by the variable, not the code
    plugin = ApexPrecision("O2", half_dtype=torch.bfloat16, loss_scale=128, max_consecutive_skips=0)
    assert repr(plugin) == ("ApexPrecision('O2', half_dtype=torch.bfloat16, loss_scale=128.0, "
                            "master_weights='remainder' (CORE_OPS_MASTER_WEIGHTS), max_consecutive_skips=0)")
    assert type(plugin).__qualname__ == "ApexPrecision" and type(plugin).__module__ == "core_ops_lightning.pytorch"
