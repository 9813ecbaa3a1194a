"""Apex's import paths resolve to core_ops, and an unmodified Apex script trains when
run with ``python -m core_ops.compat.apex``."""

import math
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


@pytest.mark.parametrize("ending, raised, group_left", [("", None, False),
                                                         ("import sys; sys.exit(0)", SystemExit, False),
                                                         ("raise RuntimeError('stopped')", RuntimeError, True)])
def test_the_runner_destroys_the_process_group_a_script_ends_with(ending, raised, group_left, tmp_path,
                                                                  monkeypatch):
    """An Apex-era script never calls destroy_process_group; torch's teardown of the group
    at interpreter exit can then abort the process (pytorch#190489: seen here as a
    torchrun launch of apex_ddp_train.py failing with SIGABRT after it finished). The
    runner destroys it when the script ends well, and keeps it when the script raised."""
    import torch.distributed as dist
    from core_ops._runner import run
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run() sets them as python would
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\n"
                      f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, "
                      f"world_size=1)\n{ending}\n")
    try:
        if raised is None:
            assert run([str(script)], "usage", "test") == 0
        else:
            with pytest.raises(raised):
                run([str(script)], "usage", "test")
        assert dist.is_initialized() == group_left
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_launcher_s_local_rank_reaches_the_script(tmp_path):
    """``python -m torch.distributed.launch ... -m core_ops.compat.apex train.py`` puts
    ``--local-rank=N`` before the script, as the argument it gives a script it runs."""
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    (tmp_path / "mod.py").write_text("import sys\nprint(sys.argv[1:])\n")
    # An Apex-era script declares torch < 2.0's spelling; argparse would refuse the new one.
    old = tmp_path / "old.py"
    old.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int)\n"
                   "print([f'--local_rank={p.parse_args().local_rank}'])\n")
    for args, want in ((["--local-rank=1", str(script), "--lr", "1"], "['--local-rank=1', '--lr', '1']"),
                       (["--local-rank=1", str(old)], "['--local_rank=1']"),
                       (["--local_rank", "0", str(script)], "['--local_rank', '0']"),
                       (["--local-rank=1", "-m", "mod", "--x"], "['--local-rank=1', '--x']")):
        proc = subprocess.run([sys.executable, "-m", "core_ops.compat.apex", *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        assert proc.stdout.strip() == want, proc.stderr


def test_spawned_children_import_apex(tmp_path):
    # Before, the children of `python -m core_ops.compat.apex` had no alias finder:
    # ModuleNotFoundError: No module named 'apex', and spawn exited with code 1.
    out = run_script(os.path.join(HERE, "apex_spawn_children.py"), str(tmp_path / "rank"))
    assert "loader [[0.0, 1.0], [4.0, 9.0]]" in out
    for rank in (0, 1):
        assert (tmp_path / f"rank.{rank}").read_text() == (
            "core_ops.amp core_ops.optimizers.larc core_ops.optimizers core_ops.compat.apex_extensions.amp_C")


def test_import_aliases():
    import core_ops.amp
    import core_ops.compat.apex  # noqa: F401
    import core_ops.compat.apex_extensions.amp_C as our_amp_c
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
    # Apex's argument order over core_ops' class (core_ops.compat.apex.parallel)
    assert issubclass(DistributedDataParallel, core_ops.parallel.DistributedDataParallel)
    assert (SyncBatchNorm, convert_syncbn_model) == (core_ops.parallel.SyncBatchNorm,
                                                     core_ops.parallel.convert_syncbn_model)
    assert LARC is core_ops.optimizers.LARC
    t = [torch.ones(2), torch.zeros(3)]
    assert torch.equal(apex_C.unflatten(apex_C.flatten(t), t)[1], t[1])
    with pytest.raises(ModuleNotFoundError, match="core_ops replaces Apex's apex.amp.*not apex.transformer"):
        import apex.transformer  # noqa: F401
    with pytest.raises(ModuleNotFoundError, match="core_ops has no core_ops.compat.apex.contrib.xentropy"):
        import apex.contrib.xentropy  # noqa: F401
    with pytest.raises(ModuleNotFoundError, match="No module named 'apex.amp.nothing'"):
        import apex.amp.nothing  # noqa: F401


def test_apex_attributes_and_module_paths():
    import core_ops.compat.apex  # noqa: F401
    import core_ops.parallel
    code = (  # a fresh interpreter: `import apex` alone, as Apex's ImageNet example does
        "import core_ops.compat.apex, apex\n"
        "print(apex.amp.__name__, apex.parallel.__name__, apex.optimizers.__name__, "
        "apex.normalization.__name__, apex.multi_tensor_apply.__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["core_ops.amp", "core_ops.compat.apex.parallel",
                                   "core_ops.optimizers", "core_ops.normalization",
                                   "core_ops.multi_tensor_apply"], proc.stderr
    from apex.amp import _amp_state
    from apex.amp._amp_state import _amp_state as state_object
    from apex.amp.scaler import LossScaler
    from apex.multi_tensor_apply.multi_tensor_apply import MultiTensorApply
    from apex.normalization.fused_layer_norm import FusedLayerNorm, FusedRMSNorm
    from apex.parallel.LARC import LARC
    from apex.parallel.optimized_sync_batchnorm import SyncBatchNorm
    assert _amp_state is state_object is core_ops.amp._amp_state
    assert LossScaler is core_ops.amp.LossScaler
    assert MultiTensorApply is core_ops.multi_tensor_apply.MultiTensorApply
    assert (FusedLayerNorm, FusedRMSNorm) == (core_ops.normalization.FusedLayerNorm,
                                              core_ops.normalization.FusedRMSNorm)
    # Each fused optimizer's module path: tests/optimizers/test_optimizer_apex_alias.py.
    assert LARC is core_ops.optimizers.LARC and SyncBatchNorm is core_ops.parallel.SyncBatchNorm
    # Importing apex.parallel.LARC (a module) leaves core_ops.parallel.LARC the class.
    import apex.parallel
    assert apex.parallel.LARC is core_ops.parallel.LARC is LARC
    with pytest.raises(ImportError, match="cannot import name 'nothing' from 'apex.parallel.LARC'"):
        from apex.parallel.LARC import nothing  # noqa: F401


def test_amp_c_optimizer_kernels():
    import core_ops.compat.apex  # noqa: F401
    from apex.multi_tensor_apply import multi_tensor_applier

    import amp_C
    g = torch.tensor([0.5, -1.0, 2.0])
    noop = torch.zeros(1, dtype=torch.int32)

    # Adam, AdamW mode, step 2 with Apex's formula (float64 here).
    p0, m0, v0 = torch.tensor([1.0, 2.0, -3.0]), torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.01, 0.02, 0.03])
    p, m, v = p0.clone(), m0.clone(), v0.clone()
    multi_tensor_applier(amp_C.multi_tensor_adam, noop, [[g], [p], [m], [v]],
                         0.1, 0.9, 0.999, 1e-8, 2, 1, 1, 0.01)
    gd, pd = g.double(), p0.double()
    md, vd = 0.9 * m0.double() + 0.1 * gd, 0.999 * v0.double() + 0.001 * gd * gd
    update = (md / (1 - 0.9**2)) / ((vd / (1 - 0.999**2)).sqrt() + 1e-8) + 0.01 * pd
    torch.testing.assert_close(p, (pd - 0.1 * update).float(), rtol=2e-7, atol=1e-7)
    torch.testing.assert_close(m, md.float(), rtol=2e-7, atol=0)
    torch.testing.assert_close(v, vd.float(), rtol=2e-7, atol=0)
    # ...with half lists (Apex kept the state in the param dtype).
    ph, mh, vh = p0.half(), m0.half(), v0.half()
    multi_tensor_applier(amp_C.multi_tensor_adam, noop, [[g.half()], [ph], [mh], [vh]],
                         0.1, 0.9, 0.999, 1e-8, 2, 1, 1, 0.01)
    assert mh.dtype == torch.float16
    torch.testing.assert_close(ph, (pd - 0.1 * update).half(), rtol=1e-3, atol=1e-3)

    # SGD with fp32 masters of half params, grads times 1/scale, momentum after a first run.
    master, mom = torch.tensor([1.0, 2.0, -3.0]), torch.tensor([0.5, 0.5, 0.5])
    model = master.half()
    multi_tensor_applier(amp_C.multi_tensor_sgd, noop, [[(g * 4).half()], [master], [mom], [model]],
                         0.0, 0.9, 0.0, 0.1, False, False, False, 0.25)
    # float32 results within one rounding of the float64 formula
    torch.testing.assert_close(mom, 0.9 * torch.tensor([0.5, 0.5, 0.5]) + g, rtol=1.2e-7, atol=0)
    torch.testing.assert_close(master, torch.tensor([1.0, 2.0, -3.0]) - 0.1 * mom, rtol=1.2e-7, atol=0)
    assert torch.equal(model, master.half())
    stepped = master.clone()
    noop.fill_(1)  # Apex's SGD kernel skips when the flag is set
    multi_tensor_applier(amp_C.multi_tensor_sgd, noop, [[g], [master], [mom]],
                         0.0, 0.9, 0.0, 0.1, False, False, False, 1.0)
    assert torch.equal(master, stepped)

    # Adagrad, L2 mode: h += g^2; p -= lr * g / (sqrt(h) + eps), with g += wd * p first.
    p, h = torch.tensor([1.0, 2.0, -3.0]), torch.tensor([1.0, 1.0, 1.0])
    multi_tensor_applier(amp_C.multi_tensor_adagrad, noop, [[g], [p], [h]], 0.1, 1e-10, 0, 0.5)
    gd = g.double() + 0.5 * torch.tensor([1.0, 2.0, -3.0], dtype=torch.float64)
    hd = 1.0 + gd * gd
    torch.testing.assert_close(h, hd.float(), rtol=2e-7, atol=0)
    torch.testing.assert_close(p, (torch.tensor([1.0, 2.0, -3.0]).double() - 0.1 * gd / (hd.sqrt() + 1e-10)).float(),
                               rtol=2e-7, atol=1e-7)
    norm, _ = multi_tensor_applier(amp_C.multi_tensor_l2norm_mp, noop, [[g.half()]], False)
    assert norm.dtype == torch.float32 and float(norm) == pytest.approx(math.sqrt(5.25))


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
    assert out.dtype == torch.float32  # the weight's dtype, as Apex's mixed-dtype kernels
    torch.testing.assert_close(out.double(), ref, rtol=8e-3, atol=8e-3)  # the input's bf16 rounding


def test_megatron_style_fused_norm_functions():
    # Megatron-LM / NeMo / DeepSpeed import these from apex.normalization.fused_layer_norm
    # and call X.apply(...); without them Megatron decides that Apex is missing.
    import core_ops.compat.apex  # noqa: F401
    from apex.normalization.fused_layer_norm import (FusedLayerNormAffineFunction,
                                                     FusedRMSNormAffineFunction,
                                                     mixed_dtype_fused_layer_norm_affine)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w, b = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    # core_ops' norm kernels against torch's: the same formula, sums in another order.
    fp64, fp32 = dict(rtol=1e-12, atol=1e-12), dict(rtol=2e-6, atol=2e-6)
    y = FusedLayerNormAffineFunction.apply(x, w, b, 8, 1e-5)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5), **fp64)
    y.sum().backward()
    assert x.grad is not None
    r = FusedRMSNormAffineFunction.apply(x.detach(), w, (8,), 1e-5, False)
    torch.testing.assert_close(r, torch.nn.functional.rms_norm(x.detach(), (8,), w, 1e-5), **fp64)
    half = x.detach().bfloat16()  # fp32 weights, half input: float32 out, as Apex's kernel
    out = mixed_dtype_fused_layer_norm_affine(half, w.float(), b.float(), [8], 1e-5)
    expect = torch.nn.functional.layer_norm(half.float(), (8,), w.float(), b.float(), 1e-5)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expect, **fp32)


def test_the_legacy_apis_import_from_apex():
    import core_ops.amp
    import core_ops.compat.apex
    import core_ops.mlp
    import apex
    from apex import amp
    from apex.contrib.optimizers import FP16_Optimizer as ContribFP16
    from apex.fp16_utils import FP16_Optimizer
    from core_ops.compat.apex import contrib, fp16_utils
    assert amp.init is core_ops.amp.init and apex.fp16_utils is fp16_utils and apex.contrib is contrib
    assert FP16_Optimizer is fp16_utils.FP16_Optimizer and ContribFP16 is contrib.optimizers.FP16_Optimizer
    assert apex.mlp.MLP is core_ops.mlp.MLP
