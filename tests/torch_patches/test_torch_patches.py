"""Note [Patches to torch]: every module of core_ops.torch_patches declares the torch
releases it applies to, what torch lacks (a reproducer in tools/upstream/ or an issue)
and what is lost without it; CORE_OPS_TORCH_PATCHES_OFF=<name> leaves torch as it is
(checked on torch's own objects, and by a run that behaves unpatched)."""

import importlib
import pkgutil
import re
import warnings
from pathlib import Path

import pytest
import torch

import core_ops.torch_patches as torch_patches
from core_ops.settings import BadEnvironment
from core_ops.torch_patches import NAMES, VARIABLE, Patch, _patch, switched_off

ROOT = Path(__file__).resolve().parents[2]


def modules():
    return {m.name: importlib.import_module(f"core_ops.torch_patches.{m.name}")
            for m in pkgutil.iter_modules(torch_patches.__path__) if not m.name.startswith("_")}


def pinned_torch():
    """(lowest, first unsupported) torch release of pyproject.toml's dependency pin."""
    pin = re.search(r'"torch>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    return pin[1], pin[2]


def test_every_patch_module_declares_its_releases_its_reproducer_and_its_switch():
    found = modules()
    assert sorted(found) == sorted(NAMES)
    docs = (ROOT / "docs" / "torch-patches.md").read_text()
    low, high = (_patch._release(v) for v in pinned_torch())
    for name, module in found.items():
        patch = module.PATCH
        assert isinstance(patch, Patch) and patch.name == name
        first, last = (_patch._release(v) for v in patch.torch)
        assert low <= first < last <= high, (name, patch.torch)  # within the releases core-ops supports
        assert patch.applies()  # so CI runs with every patch in place
        if patch.upstream.startswith("tools/"):
            assert (ROOT / patch.upstream).is_file(), patch.upstream
        assert f"`{name}`" in docs and patch.upstream in docs, name
    assert VARIABLE in docs


@pytest.mark.parametrize("fields,said", [
    (dict(name="ddp"), r"Patch name 'ddp' must be one of"),
    (dict(torch=("2.15", "2.9")), r"lowest < first, got \('2.15', '2.9'\)"),
    (dict(torch=("2.9",)), r"lowest < first"),
    (dict(torch=("two", "2.9")), r"not a torch release: 'two'"),
    (dict(upstream="see the forums"), r"upstream must be tools/upstream/<script>.py or https://github.com/"),
    (dict(when_off=" "), r"when_off must say what is lost"),
])
def test_a_patch_declared_badly_is_refused(fields, said):
    good = dict(name="inductor_norms", torch=("2.9", "2.16"), upstream="tools/upstream/x.py", when_off="x")
    with pytest.raises(ValueError, match=said):
        Patch(**{**good, **fields})


def test_the_switch_takes_names_or_all_and_refuses_anything_else():
    assert switched_off({}) == set()
    assert switched_off({VARIABLE: " inductor_norms,grad_scaler_flags ,"}) == {"inductor_norms", "grad_scaler_flags"}
    assert switched_off({VARIABLE: "all"}) == set(NAMES)
    with pytest.raises(BadEnvironment, match=r"CORE_OPS_TORCH_PATCHES_OFF='inductor_norm': inductor_norm is not "
                                             r"a patch to torch; expected a comma-separated list of ddp_init_broadcast"):
        switched_off({VARIABLE: "inductor_norm"})


def test_the_variable_is_declared_and_a_bad_value_stops_the_import():
    """As every CORE_OPS_* variable: set, it is read at ``import core_ops``."""
    import os
    import subprocess
    import sys
    code = ("import core_ops, core_ops.torch_patches.inductor_norms as p; "
            "print(sorted(core_ops.torch_patches.switched_off()), p.install())")
    runs = {value: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                                  env=dict(os.environ, **{VARIABLE: value}))
            for value in ("inductor_norms", "inductor_norm")}
    assert runs["inductor_norms"].stdout.split() == ["['inductor_norms']", "False"], runs["inductor_norms"].stderr
    assert runs["inductor_norm"].returncode == 1
    assert runs["inductor_norm"].stderr.strip().splitlines()[-1].startswith(
        "core_ops.settings.BadEnvironment: CORE_OPS_TORCH_PATCHES_OFF='inductor_norm': inductor_norm is not a "
        "patch to torch")


def test_a_torch_outside_the_releases_is_left_unpatched_saying_what_that_costs(monkeypatch):
    from core_ops.torch_patches import inductor_norms
    patch = inductor_norms.PATCH
    assert [patch.applies(v) for v in ("2.9.1", "2.10.0", "2.15.2+cu130", "2.16.0.dev20270101")] == [
        False, True, True, False]
    monkeypatch.setattr(_patch, "_WARNED", set())
    monkeypatch.setattr(torch, "__version__", "2.16.0")
    with pytest.warns(RuntimeWarning, match=r"torch_patches.inductor_norms: torch 2.16.0 is outside the releases "
                                            r"it was checked on \[2.10, 2.16\)\. inductor calls the norm ops'"):
        assert not patch.active({})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        assert not patch.active({})


# ---- switched off, each patch leaves torch as it is --------------------------------


@pytest.fixture
def restored():
    """Each patch module as the test found it: installed or not."""
    found = {name: m for name, m in modules().items() if hasattr(m, "installed")}
    before = {name: m.installed() for name, m in found.items()}
    yield
    for name, m in found.items():
        m.uninstall()
        if before[name]:
            m.install()


def check_installs_only_when_on(module, monkeypatch):
    """``install`` with the patch switched off changes nothing; switched on, it patches."""
    module.uninstall()
    monkeypatch.setenv(VARIABLE, module.PATCH.name)
    assert module.install() is False and not module.installed()
    monkeypatch.setenv(VARIABLE, "all")
    assert module.install() is False and not module.installed()
    monkeypatch.delenv(VARIABLE)
    assert module.install() is True and module.installed()


def test_ddp_init_broadcast_off_leaves_ddp_init_as_torch_wrote_it(restored, monkeypatch):
    from core_ops.torch_patches import ddp_init_broadcast as patch
    patch.uninstall()
    original = torch.nn.parallel.DistributedDataParallel.__init__
    check_installs_only_when_on(patch, monkeypatch)
    assert torch.nn.parallel.DistributedDataParallel.__init__.__wrapped__ is original
    patch.uninstall()
    monkeypatch.setenv(VARIABLE, "ddp_init_broadcast")
    patch.install()
    assert torch.nn.parallel.DistributedDataParallel.__init__ is original


def test_inductor_twin_reductions_off_leaves_the_cpu_codegen_as_torch_wrote_it(restored, monkeypatch):
    from torch._inductor.codegen.cpp import CppVecKernel

    from core_ops.torch_patches import inductor_twin_reductions as patch
    patch.uninstall()
    original = CppVecKernel.store_reduction
    check_installs_only_when_on(patch, monkeypatch)
    assert CppVecKernel.store_reduction.__wrapped__ is original
    patch.uninstall()
    monkeypatch.setenv(VARIABLE, "inductor_twin_reductions")
    patch.install_when_imported()  # inductor's codegen is loaded: at once
    assert CppVecKernel.store_reduction is original


def test_inductor_norms_off_leaves_the_norm_ops_opaque_to_inductor(restored, monkeypatch, tmp_path):
    from torch._inductor import decomposition
    from torch._inductor.utils import run_and_get_code

    from core_ops.normalization import FusedRMSNorm
    from core_ops.torch_patches import inductor_norms as patch
    check_installs_only_when_on(patch, monkeypatch)
    patch.uninstall()
    monkeypatch.setenv(VARIABLE, "inductor_norms")
    patch.install_when_imported()
    assert not any(op in decomposition.decompositions for op in patch._ops())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    norm = FusedRMSNorm(64)
    _, code = run_and_get_code(torch.compile(norm), torch.randn(8, 64))
    torch._dynamo.reset()
    assert any("core_ops.rms_norm_fwd" in c for c in code)  # called, not generated


@pytest.mark.parametrize("off,scale", [(False, 2.0**15), (True, 2.0**17)])
def test_grad_scaler_flags_off_leaves_grad_scaler_unaware_of_the_step_overflow(off, scale, monkeypatch):
    """tools/upstream/grad_scaler_misses_step_overflow.py: on, a norm overflowing inside
    FusedLAMB's step halves GradScaler's scale; off, torch's GradScaler grows it. The
    step is skipped either way."""
    from core_ops.optimizers import FusedLAMB
    if off:
        monkeypatch.setenv(VARIABLE, "grad_scaler_flags")
    param = torch.nn.Parameter(torch.ones(64))
    opt = FusedLAMB([param], lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1)
    scaler.scale(torch.ones(()))
    param.grad = torch.full((64,), 3e18)  # finite; its squared norm overflows float32
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == scale
    assert torch.equal(param.detach(), torch.ones(64))


def test_fsdp_policy_slots_off_leaves_fsdp2_state_alone_and_names_the_route(world1, monkeypatch):
    from torch.distributed.fsdp import fully_shard

    from core_ops import amp
    from core_ops.torch_patches import fsdp_policy_slots as patch
    monkeypatch.setenv(VARIABLE, "fsdp_policy_slots")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    fully_shard(model)
    with pytest.raises(patch.LayoutError, match=r"fsdp_policy_slots is off in this run: .* shard it with "
                                                r"fully_shard\(\.\.\., mp_policy=core_ops\.amp\.fsdp_policy"):
        amp.initialize(model, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    assert all(getattr(owner, name).param_dtype is None for owner, name in patch.slots(patch.state_of(model)))
