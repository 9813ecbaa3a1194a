"""``strategy="apex-fsdp"`` and Lightning's ModelParallelStrategy under Apex's precision,
on 2 gloo processes: one launch of lightning_fsdp_runs.py, its fits compared here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_cases import assert_steps_equal

HERE = Path(__file__).parent


def _launch(out, *args, stem, ranks=2):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(HERE / "lightning_fsdp_runs.py"), *args, str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [torch.load(out / f"{stem}-rank{r}.pt", weights_only=False) for r in range(ranks)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("fsdp"), stem="fsdp")


@pytest.fixture(scope="module")
def fabric_runs(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("fabric"), "fabric", stem="fabric")


def test_apex_o2_on_fsdp2_holds_float32_shards_of_half_the_model(runs):
    for r in runs:
        assert r["fsdp"]["dtypes"] == ["torch.float32"] and r["fsdp"]["types"] == ["DTensor"]
        assert r["ddp"]["dtypes"] == ["torch.float16"]  # apex-ddp: half model, masters in the optimizer
    assert runs[0]["fsdp"]["local"] + runs[1]["fsdp"]["local"] == runs[0]["fsdp"]["whole"]


def test_apex_fsdp_cpu_offload_trains_as_without_it(runs):
    """ApexFSDPStrategy(cpu_offload=True): every unit sharded with FSDP2's
    CPUOffloadPolicy, FusedAdam's state on the CPU shards. On a CPU-only machine the
    shards are on the CPU already (the policy's copies are onto the same device; the same
    collectives and kernels on the same values), so every step's loss, scale and params
    are those of the run without it, bit for bit."""
    for r in runs:
        offload = r["fsdp_offload"]
        assert offload["offload"] == [("CPUOffloadPolicy", True)]
        assert offload["optimizer"] == "FusedAdam" and offload["state_devices"] == ["cpu"]
        assert offload["types"] == ["DTensor"] and offload["local"] == r["fsdp"]["local"]
        assert_steps_equal(r["fsdp"]["history"], offload["history"], scale="scale")


def test_a_compiled_module_trains_on_apex_fsdp_as_the_eager_one(runs):
    """module.compile() (in place, aot_eager) under apex-O2 + apex-fsdp, an inf on rank 1
    at step 2, clipped: every step's loss, scale and params as the eager run's, bit for bit."""
    for r in runs:
        assert r["fsdp_compiled"]["graphs"] > 0  # it did run compiled
        assert_steps_equal(r["fsdp"]["history"], r["fsdp_compiled"]["history"], scale="scale")


def test_apex_fsdp_trains_as_apex_ddp_and_skips_an_overflow_on_both_ranks(runs):
    for r in runs:
        fsdp, ddp = r["fsdp"]["history"], r["ddp"]["history"]
        assert len(fsdp) == len(ddp) == 4
        # Step 0 overflows fp16 at the first scale; rank 1's loss is inf at step 2: both
        # ranks skip both, params unchanged, the scale halved each time.
        assert [h["scale"] for h in fsdp] == [2.0**15, 2.0**15, 2.0**14, 2.0**14]
        assert [h["scale"] for h in ddp] == [h["scale"] for h in fsdp]
        assert torch.equal(fsdp[1]["params"], fsdp[2]["params"])
        assert not torch.equal(fsdp[2]["params"], fsdp[3]["params"])
        # apex-ddp rounds each step's mean grads to its fp16 half params' grads (2^-12
        # relative), FSDP2 reduce-scatters into float32 shards; clipped Adam steps of lr
        # 0.01, and apex-ddp's params are the fp16 copies of its masters (2^-11 relative):
        # 4.7e-4 apart after the 2 steps taken, bound 2e-3.
        for a, b in zip(fsdp, ddp):
            torch.testing.assert_close(a["params"], b["params"].float(), rtol=0, atol=2e-3)
    assert torch.equal(runs[0]["fsdp"]["history"][-1]["params"], runs[1]["fsdp"]["history"][-1]["params"])


@pytest.mark.parametrize("form", ["sharded", "full"])
def test_apex_fsdp_resumes_exactly_from_its_checkpoints(runs, form):
    assert runs[0][f"{form}_is_dir"] == (form == "sharded")  # a DCP folder, or one file
    for r in runs:
        whole, resumed = r["whole"]["history"], r[f"resumed_{form}"]["history"]
        assert len(resumed) == 4 and len(whole) == 8
        for a, b in zip(whole[4:], resumed):
            assert torch.equal(a["params"], b["params"]) and torch.equal(a["loss"], b["loss"]), (form, a["step"])
            assert a["scale"] == b["scale"]


def test_lightnings_model_parallel_strategy_runs_apex_precision(runs):
    for r in runs:
        mp = r["model_parallel"]
        assert mp["dtypes"] == ["torch.float32"] and mp["types"] == ["DTensor"]
        losses = torch.stack([h["loss"] for h in mp["history"]])
        assert len(losses) == 4 and torch.isfinite(losses).all()
    # The first step's loss is of the model as built, gathered in bf16: the fp16 run's
    # to bf16's 2^-8.
    for r in runs:
        torch.testing.assert_close(r["model_parallel"]["history"][0]["loss"], r["fsdp"]["history"][0]["loss"],
                                   rtol=1e-2, atol=0)


def _check_fabric(fabric_runs):
    for r in fabric_runs:
        fsdp, ddp = r["apex-fsdp"], r["apex-ddp"]
        assert fsdp["dtypes"] == ["torch.float32"] and fsdp["types"] == ["DTensor"]
        assert ddp["dtypes"] == ["torch.float16"]
        # The last rank's loss is inf at step 2: every rank skips it, halving the scale.
        assert [h["scale"] for h in fsdp["history"]] == [2.0**16, 2.0**16, 2.0**15, 2.0**15]
        assert torch.equal(fsdp["history"][1]["params"], fsdp["history"][2]["params"])
        for a, b in zip(fsdp["history"], ddp["history"]):
            # The clip's norm is the whole model's on both (FSDP2's from the shards, one
            # collective): float32 sums in another order; the fp16 grads are the same.
            if torch.isfinite(b["norm"]):
                torch.testing.assert_close(a["norm"], b["norm"], rtol=1e-5, atol=0)
            # Both reduce in float32; apex-ddp then rounds the mean to fp16 grads and
            # holds fp16 params (2^-11): 4.9e-4 apart after 3 clipped steps of lr 0.01.
            torch.testing.assert_close(a["params"], b["params"], rtol=0, atol=2e-3)
    for other in fabric_runs[1:]:
        for a, b in zip(fabric_runs[0]["apex-fsdp"]["history"], other["apex-fsdp"]["history"]):
            assert torch.equal(a["params"], b["params"])
            assert torch.equal(a["norm"], b["norm"]) or (torch.isnan(a["norm"]) and torch.isnan(b["norm"]))


def test_fabric_apex_fsdp_trains_as_apex_ddp_skips_and_clips_by_the_global_norm(fabric_runs):
    _check_fabric(fabric_runs)


def test_fabric_apex_fsdp_resumes_exactly_from_fabric_save(fabric_runs):
    for r in fabric_runs:
        assert r["resume"]["is_dir"]  # a torch.distributed.checkpoint folder, each rank its shards
        assert torch.equal(r["resume"]["straight"], r["resume"]["resumed"])


def test_apex_fsdp_on_four_processes(tmp_path):
    runs = _launch(tmp_path, "four", stem="four", ranks=4)  # the Trainer's runs, then Fabric's
    assert sum(r["fsdp"]["local"] for r in runs) == runs[0]["fsdp"]["whole"]  # a quarter each
    for r in runs:
        fsdp, ddp = r["fsdp"]["history"], r["ddp"]["history"]
        # Rank 3's loss is inf at step 1: every rank skips it.
        assert [h["scale"] for h in fsdp] == [2.0**16, 2.0**15, 2.0**15, 2.0**15] == [h["scale"] for h in ddp]
        assert torch.equal(fsdp[0]["params"], fsdp[1]["params"])
        for a, b in zip(fsdp, ddp):  # as on 2 processes: 4.5e-4 apart here
            torch.testing.assert_close(a["params"], b["params"].float(), rtol=0, atol=2e-3)
    _check_fabric([torch.load(tmp_path / f"fabric4-rank{r}.pt", weights_only=False) for r in range(4)])
