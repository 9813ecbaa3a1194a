"""Apex's import paths resolve to core_ops, and an unmodified Apex script trains when
run with ``python -m core_ops.compat.apex``."""

import os
import re
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "apex_style_train.py")


def run_script(*args, timeout=240):
    cmd = [sys.executable, "-m", "core_ops.compat.apex", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("level, dtype", [("O1", "float32"), ("O2", "float16")])
def test_unmodified_apex_script_trains(level, dtype, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    out = run_script(SCRIPT, "--opt-level", level, "--checkpoint", str(ckpt))
    m = re.search(r"first_loss=([\d.]+) final_loss=([\d.]+) grad_norm=([\d.]+) "
                  r"weight_dtype=torch.(\w+) loss_scale=([\d.]+)", out)
    assert m, out
    first, final, grad_norm = float(m[1]), float(m[2]), float(m[3])
    assert final < 0.4 * first and grad_norm > 0
    assert m[4] == dtype and float(m[5]) == 2.0**16
    saved = torch.load(ckpt)
    assert set(saved["amp"]) == {"loss_scaler0"} and saved["amp"]["loss_scaler0"]["unskipped"] == 40
    assert saved["model"]["0.weight"].dtype == torch.float32


def test_module_form_and_usage(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text("import sys\nfrom apex.optimizers import FusedSGD\n"
                                 "print('ok', FusedSGD.__module__, sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, "-m", "core_ops.compat.apex", "-m", "mypkg.main", "--x"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.stdout.strip() == "ok core_ops.optimizers.fused_sgd ['--x']", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "core_ops.compat.apex", "missing.py"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no such script: missing.py" in proc.stderr


def test_import_aliases():
    import core_ops.amp
    import core_ops.compat.apex  # noqa: F401
    import core_ops.multi_tensor_apply.amp_C as our_amp_c
    import core_ops.normalization
    import core_ops.optimizers

    import amp_C
    import apex
    import apex_C
    from apex import amp
    from apex.normalization import FusedLayerNorm
    from apex.optimizers import FusedAdam, FusedLAMB  # noqa: F401

    assert amp is core_ops.amp and apex.amp is core_ops.amp
    assert apex.optimizers is core_ops.optimizers and FusedAdam is core_ops.optimizers.FusedAdam
    assert FusedLayerNorm is core_ops.normalization.FusedLayerNorm and amp_C is our_amp_c
    assert core_ops.amp.__spec__.name == "core_ops.amp"  # still itself under its own name
    import core_ops.parallel
    from apex.parallel import LARC, DistributedDataParallel, SyncBatchNorm, convert_syncbn_model
    assert DistributedDataParallel is core_ops.parallel.DistributedDataParallel
    assert (SyncBatchNorm, convert_syncbn_model) == (core_ops.parallel.SyncBatchNorm,
                                                     core_ops.parallel.convert_syncbn_model)
    assert LARC is core_ops.optimizers.LARC
    t = [torch.ones(2), torch.zeros(3)]
    assert torch.equal(apex_C.unflatten(apex_C.flatten(t), t)[1], t[1])
    with pytest.raises(ModuleNotFoundError, match="core_ops replaces Apex's apex.amp.*not apex.contrib"):
        import apex.contrib  # noqa: F401
    with pytest.raises(ModuleNotFoundError, match="No module named 'apex.amp.nothing'"):
        import apex.amp.nothing  # noqa: F401


def test_normalization_matches_torch():
    from core_ops.normalization import FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm
    torch.manual_seed(0)
    x = torch.randn(4, 6, 10, dtype=torch.float64)
    ln = MixedFusedLayerNorm(10).double()
    torch.testing.assert_close(ln(x), torch.nn.functional.layer_norm(x, (10,), eps=1e-5))
    rms = FusedRMSNorm(10).double()
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(rms(x), ref, rtol=1e-12, atol=1e-12)
    half = x.to(torch.bfloat16)
    out = MixedFusedRMSNorm(10)(half)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=8e-3, atol=8e-3)  # one bf16 rounding
