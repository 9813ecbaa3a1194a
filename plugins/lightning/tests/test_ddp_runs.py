"""The Lightning plugin on 2 gloo processes: real Trainer and Fabric launches
(ddp_runs.py), one per suite, each suite's runs compared here. Tolerances: bit for bit
where the same kernels run in the same order on the same values (ranks after DDP, a
resume); 2 ranks against one process differ in the order of float32 sums (the
allreduce, SyncBatchNorm's merged statistics): 1e-5."""

import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import core_ops_lightning  # noqa: F401  (the apex-* names)
from lightning_cases import assert_steps_equal, flat, loader, make_module

HERE = Path(__file__).parent


def launch(suite, tmp_path, timeout=420):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(HERE / "ddp_runs.py"), suite, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [torch.load(tmp_path / f"{suite}-rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    return launch("trainer", tmp_path_factory.mktemp("trainer"))


def test_ranks_seeded_apart_end_identical_in_every_run(trainer_runs):
    r0, r1 = trainer_runs
    for case in ("o2", "o0_syncbn", "accumulate", "whole", "resumed", "torch_ddp", "lightning_precision",
                 "manual"):
        assert torch.equal(r0[case]["params"], r1[case]["params"]), case
        for a, b in zip(r0[case]["history"], r1[case]["history"]):
            assert torch.equal(a["params"], b["params"]), f"{case}: ranks differ after step {a['step']}"


def test_o2_with_syncbn_keeps_batchnorm_fp32_and_reverts_it_after_fit(trainer_runs):
    o2 = trainer_runs[0]["o2"]
    assert o2["dtypes"] == ["torch.float16", "torch.float32"]
    assert "BatchNorm2d" in o2["types"] and "SyncBatchNorm" not in o2["types"]


def test_an_inf_on_one_rank_skips_the_step_and_the_schedule_on_both(trainer_runs):
    for r in trainer_runs:  # rank 1's loss is inf at global step 2 (the third step)
        history = {h["step"]: h for h in r["o2"]["history"]}  # 4 steps: 128 samples, 2 x 16
        before, skipped, after = history[2], history[3], history[4]
        assert torch.equal(before["params"], skipped["params"])
        assert not torch.equal(skipped["params"], after["params"])
        assert before["lr"] == skipped["lr"] and after["lr"] < skipped["lr"]  # held, then on again
        assert (before["loss_scale"], skipped["loss_scale"]) == (2.0**16, 2.0**15)
        assert (before["skipped"], skipped["skipped"]) == (0.0, 1.0)


def test_two_ranks_with_syncbn_equal_one_process_on_the_whole_batch(trainer_runs):
    Net = make_module(pl)
    model = Net(seed=0)
    trainer = pl.Trainer(precision="apex-O0", max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader(batch=32))  # 2 ranks x 16, DistributedSampler interleaving the same samples
    torch.testing.assert_close(trainer_runs[0]["o0_syncbn"]["params"], flat(model.parameters()),
                               rtol=1e-5, atol=1e-6)


def test_a_compiled_module_trains_on_apex_ddp_as_the_eager_one(trainer_runs):
    """torch.compile(module) (aot_eager) under apex-O2 + apex-ddp + SyncBN, an inf on
    rank 1 at step 2: every step as the eager run, bit for bit (the same kernels)."""
    for r in trainer_runs:
        assert r["o2_compiled"]["graphs"] > 0  # it did run compiled
        assert_steps_equal(r["o2"]["history"], r["o2_compiled"]["history"])


def test_accumulating_micro_batches_send_no_collective(trainer_runs):
    counts = trainer_runs[0]["accumulate"]["collectives"]
    assert len(counts) == 4 and counts[0::2] == [0] * 2 and all(c > 0 for c in counts[1::2])


def test_resume_equals_the_uninterrupted_run_bit_for_bit(trainer_runs):
    for r in trainer_runs:
        assert torch.equal(r["whole"]["params"], r["resumed"]["params"])
        assert [h["step"] for h in r["resumed"]["history"]] == [5, 6, 7, 8]  # the second epoch
        assert r["resumed"]["history"][0]["loss_scale"] == r["whole"]["history"][4]["loss_scale"]


def test_the_plugin_with_lightning_s_ddp_and_the_strategy_with_lightning_s_precision(trainer_runs):
    r0 = trainer_runs[0]
    assert r0["torch_ddp"]["dtypes"] == ["torch.float16", "torch.float32"]
    assert r0["lightning_precision"]["dtypes"] == ["torch.float32"]
    for case in ("torch_ddp", "lightning_precision", "manual"):
        h = r0[case]["history"]
        assert not torch.equal(h[0]["params"], h[-1]["params"]), case


@pytest.fixture(scope="module")
def fabric_runs(tmp_path_factory):
    return launch("fabric", tmp_path_factory.mktemp("fabric"))


def test_fabric_ranks_stay_identical_and_skip_together(fabric_runs):
    r0, r1 = fabric_runs
    assert r0["dtypes"] == ["torch.float16", "torch.float32"]
    assert r0["collectives_inside_no_sync"] == 0
    for i, (a, b) in enumerate(zip(r0["train"], r1["train"])):
        assert torch.equal(a["params"], b["params"]), f"step {i}"
        assert a["skipped"] == b["skipped"] == (i == 1)  # rank 1's inf in micro-batch 2
        assert (a["norm"] == b["norm"] > 0.5) if i != 1 else (a["norm"] != a["norm"] and b["norm"] != b["norm"])
    assert torch.equal(r0["train"][0]["params"], r0["train"][1]["params"])


def test_fabric_save_and_load_resume_bit_for_bit(fabric_runs):
    for r in fabric_runs:
        assert torch.equal(r["whole"], r["resumed"])
        assert torch.equal(r["whole"], r["compiled"])  # fabric.setup(torch.compile(model)): as eager
        assert r["saved_dtypes"] == ["torch.float32"]


def test_the_standalone_packages(tmp_path):
    r0, r1 = launch("standalone", tmp_path)
    assert torch.equal(r0["o2"]["params"], r1["o2"]["params"])
    assert r0["o2"]["dtypes"] == ["torch.float16", "torch.float32"]
    h = r0["o2"]["history"]
    assert not torch.equal(h[0]["params"], h[-1]["params"])
    for r in (r0, r1):  # apex-fsdp in that tree: its own strategy class, float32 shards, learning
        fsdp = r["fsdp"]
        assert fsdp["strategy"] == "core_ops_lightning.pytorch_lightning.ApexFSDPStrategy"
        assert fsdp["types"] == ["DTensor"] and fsdp["dtypes"] == ["torch.float32"]
        assert torch.isfinite(fsdp["losses"]).all() and fsdp["losses"][-4:].mean() < fsdp["losses"][:4].mean()


def test_fabric_spawn_strategies_pickle_the_plugin(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "ddp_runs.py"), "fabric_spawn", str(tmp_path)],
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"),
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-5000:]
    for strategy in ("apex-ddp_spawn", "ddp_spawn"):
        r0, r1 = (torch.load(tmp_path / f"fabric_spawn-{strategy}-rank{r}.pt", weights_only=False) for r in (0, 1))
        assert torch.equal(r0["params"], r1["params"]), strategy
        assert r0["precision"] == "ApexPrecision" and r0["dtypes"] == ["torch.float16", "torch.float32"]
    spawned = torch.load(tmp_path / "trainer_spawn.pt", weights_only=False)  # the Trainer's apex-ddp_spawn
    assert not torch.equal(spawned["before"], spawned["after"])
    assert spawned["dtypes"] == ["torch.float32"]  # the main process's model was never cast
