"""The Accelerate plugin in one process (a real Accelerator on the CPU): it trains as a
hand-written AmpLoop on the same model and data (bit for bit: the plugin adds no
numerics), clips by the true norm, skips overflowed steps and their schedule, saves and
loads its state exactly, and refuses what it cannot run, at construction."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "support"))
import small_task as task  # noqa: E402
from core_ops.amp import AmpLoop  # noqa: E402
from core_ops import settings  # noqa: E402
from core_ops.optimizers import FusedAdam  # noqa: E402
from core_ops_accelerate import ApexPlugin, _compat  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps one state per process: each test starts from none."""
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def accelerated(plugin, seed=0, scheduler=True, optimizer=None):
    accelerator = Accelerator(kwargs_handlers=[plugin])
    model = task.conv_net(seed)
    opt = (optimizer or (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)))(model.parameters())
    objects = [model, opt, task.loader()]
    if scheduler:
        objects.append(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95))
    return (accelerator, *accelerator.prepare(*objects))


def run(accelerator, model, opt, loader, sched=None, clip=0.5, inf_at=None):
    norms, skipped = [], []
    for i, (x, y) in enumerate(loader):
        with accelerator.autocast():
            loss = F.cross_entropy(model(x), y)
        if inf_at == i:
            loss = loss * float("inf")
        accelerator.backward(loss)
        if clip is not None:
            norms.append(accelerator.clip_grad_norm_(model.parameters(), clip))
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad()
        skipped.append(accelerator.optimizer_step_was_skipped)
    return norms, skipped


def hand_written(opt_level, half_dtype, clip=0.5):
    loop = AmpLoop(opt_level, half_dtype=half_dtype)
    model = loop.prepare_model(task.conv_net(0))
    opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    sched = loop.follow_skips(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95))
    norms = []
    for x, y in task.loader():
        with loop.autocast("cpu"):
            loss = F.cross_entropy(model(x), y)
        loop.scale(loss).backward()
        loop.unscale_(opt)
        norms.append(loop.clip_grad_norm_(opt, clip))
        loop.step(opt)
        loop.update()
        sched.step()
        opt.zero_grad()
    return model, norms


@pytest.mark.parametrize("level, half", [("O1", "fp16"), ("O2", "fp16"), ("O2", "bf16"), ("O3", "bf16")])
def test_the_plugin_trains_as_a_hand_written_loop(level, half):
    accelerator, model, opt, loader, sched = accelerated(ApexPlugin(opt_level=level, half_dtype=half))
    norms, _ = run(accelerator, model, opt, loader, sched)
    theirs, their_norms = hand_written(level, torch.float16 if half == "fp16" else torch.bfloat16)
    assert torch.equal(task.flat(model.parameters()), task.flat(theirs.parameters()))
    assert [float(n) for n in norms] == [float(n) for n in their_norms]


def test_an_overflow_skips_the_step_and_the_scheduler():
    accelerator, model, opt, loader, sched = accelerated(ApexPlugin(opt_level="O2"))
    plugin = accelerator.core_ops_apex
    lrs, params = [], []
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) * (float("inf") if i == 2 else 1.0)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        lrs.append(opt.param_groups[0]["lr"])
        params.append(task.flat(model.parameters()))
        assert accelerator.optimizer_step_was_skipped == (i == 2)
    assert lrs[1] == lrs[2] > lrs[3] and torch.equal(params[1], params[2])
    assert plugin.skipped_steps == 1 and plugin.loss_scale_value == 2.0**15


def test_save_state_and_load_state_resume_exactly(tmp_path):
    batches = list(task.loader())
    accelerator, whole, wopt, _, wsched = accelerated(ApexPlugin(opt_level="O2"), seed=3)
    run(accelerator, whole, wopt, batches, wsched)
    accelerator, first, fopt, _, fsched = accelerated(ApexPlugin(opt_level="O2"), seed=3)
    run(accelerator, first, fopt, batches[:5], fsched)
    accelerator.save_state(str(tmp_path / "state"))
    ours = sorted(p.name for p in (tmp_path / "state").iterdir() if p.name.startswith(("custom_checkpoint", "optimizer")))
    assert ours == ["custom_checkpoint_0.pkl", "optimizer.bin"]  # the loss scaler, the optimizer
    for name in ours:  # no pickled classes in what core-ops saves
        torch.load(tmp_path / "state" / name, weights_only=True)
    accelerator, resumed, ropt, _, rsched = accelerated(ApexPlugin(opt_level="O2"), seed=9)
    accelerator.load_state(str(tmp_path / "state"))
    run(accelerator, resumed, ropt, batches[5:], rsched)
    assert torch.equal(task.flat(whole.parameters()), task.flat(resumed.parameters()))


@settings.patch(master_weights="remainder", half_dtype="bf16")
def test_a_torch_adamw_steps_with_remainders_through_its_fused_twin():
    plugin = ApexPlugin(opt_level="O2", fused_optimizer=True)
    accelerator, model, opt, loader, sched = accelerated(plugin, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    run(accelerator, model, opt, loader, sched, clip=None)
    inner = opt.optimizer
    assert isinstance(inner, FusedAdam) and inner.master_weights == "remainder"
    assert any("master_remainder" in s for s in inner.state.values())


def test_dynamo_backend_trains_as_eager():
    """Accelerator(dynamo_backend=...) compiles the prepared model (aot_eager: dynamo and
    AOTAutograd over core_ops' ops, no inductor codegen); with ApexPlugin at O2 it trains
    bit for bit as eager."""
    params = []
    for backend in ("no", "aot_eager"):
        torch._dynamo.reset()
        accelerator = Accelerator(dynamo_backend=backend, kwargs_handlers=[ApexPlugin(opt_level="O2", half_dtype="bf16")])
        model = task.conv_net(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, opt, loader = accelerator.prepare(model, opt, task.loader())
        run(accelerator, model, opt, loader, clip=None)
        params.append(task.flat(model.parameters()))
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert torch.equal(params[0], params[1])


@settings.patch(master_weights="remainder", half_dtype="bf16")
def test_save_state_and_load_state_resume_compact_state_exactly(tmp_path):
    """Remainders and 8-bit moments through save_state / load_state."""
    adam = lambda ps: FusedAdam(ps, lr=1e-3, state_dtype="int8", min_8bit_size=64)  # noqa: E731
    batches = list(task.loader())
    accelerator, whole, wopt, _, wsched = accelerated(ApexPlugin(opt_level="O2"), seed=3, optimizer=adam)
    run(accelerator, whole, wopt, batches, wsched, clip=None)
    accelerator, first, fopt, _, fsched = accelerated(ApexPlugin(opt_level="O2"), seed=3, optimizer=adam)
    run(accelerator, first, fopt, batches[:5], fsched, clip=None)
    accelerator.save_state(str(tmp_path / "state"))
    accelerator, resumed, ropt, _, rsched = accelerated(ApexPlugin(opt_level="O2"), seed=9, optimizer=adam)
    accelerator.load_state(str(tmp_path / "state"))
    run(accelerator, resumed, ropt, batches[5:], rsched, clip=None)
    assert torch.equal(task.flat(whole.parameters()), task.flat(resumed.parameters()))
    states = ropt.optimizer.state.values()
    assert any(s.get("master_remainder") is not None for s in states)
    assert any(s["exp_avg"].dtype == torch.uint8 for s in states)  # the 3x3 convs' 576 weights


def test_the_saved_model_is_fp32_and_a_plain_model_loads_it(tmp_path):
    accelerator, model, opt, loader = accelerated(ApexPlugin(opt_level="O2"), scheduler=False)
    run(accelerator, model, opt, loader)
    state = accelerator.get_state_dict(model)
    assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.float32}
    assert accelerator.unwrap_model(model) is model
    accelerator.save_model(model, str(tmp_path / "model"))
    plain = task.conv_net(5)
    from safetensors.torch import load_file
    plain.load_state_dict(load_file(str(tmp_path / "model" / "model.safetensors")))
    masters = [m for g in opt.param_groups for m in g["params"]]
    assert torch.equal(task.flat(plain.parameters()), task.flat(masters))


def test_fused_optimizer_swaps_in_the_twin_and_the_scheduler_follows():
    accelerator, model, opt, loader, sched = accelerated(
        ApexPlugin(opt_level="O2", fused_optimizer=True), optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    assert type(opt.optimizer) is FusedAdam and sched.scheduler.optimizer is opt.optimizer
    import warnings
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run(accelerator, model, opt, loader, sched)
    assert not [w for w in said if "overridden" in str(w.message)]  # the twin's step is marked for the scheduler
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.95 ** 8)
    with pytest.warns(UserWarning, match="RMSprop has no core_ops twin"):
        accelerated(ApexPlugin(opt_level="O2", fused_optimizer=True), optimizer=lambda ps: torch.optim.RMSprop(ps))


def test_options_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("CORE_OPS_OPT_LEVEL", "O1")
    monkeypatch.setenv("CORE_OPS_HALF_DTYPE", "bf16")
    monkeypatch.setenv("CORE_OPS_MESSAGE_SIZE", "1e6")
    plugin = ApexPlugin(sync_bn=True)
    assert (plugin.opt_level, plugin.half_dtype, plugin.message_size, plugin.sync_bn) == (
        "O1", torch.bfloat16, 1_000_000, True)
    assert ApexPlugin(opt_level="O1").opt_level == "O1"  # the argument and the variable agree
    # An argument that overrules a set variable would leave the variable unread: an error.
    with pytest.raises(ValueError, match="opt_level='O3' and CORE_OPS_OPT_LEVEL='O1' disagree, and the variable "
                                         "would be ignored: give one of them"):
        ApexPlugin(opt_level="O3")
    monkeypatch.setenv("CORE_OPS_OPT_LEVEL", "O7")
    with pytest.raises(ValueError, match="CORE_OPS_OPT_LEVEL='O7': expected one of O0, O1, O2, O3"):
        ApexPlugin()
    monkeypatch.setenv("CORE_OPS_OPT_LEVEL", "O2")
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "remainder")
    assert ApexPlugin().master_weights == "remainder"
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "half")
    with pytest.raises(ValueError, match="CORE_OPS_MASTER_WEIGHTS='half': expected one of .* or remainder"):
        ApexPlugin()
    monkeypatch.setenv("CORE_OPS_MASTER_WEIGHTS", "1")
    monkeypatch.setenv("CORE_OPS_SYNC_BN", "maybe")
    with pytest.raises(ValueError, match="CORE_OPS_SYNC_BN='maybe': expected one of 1, true"):
        ApexPlugin()


def test_remainders_from_the_environment_train_as_fp32_masters():
    """CORE_OPS_MASTER_WEIGHTS=remainder (what `accelerate launch` passes on): FusedAdam
    keeps bfloat16 params plus remainders, bit for bit the fp32-master run. (Without
    clipping: amp clips remainders' bfloat16 grads in place, one bfloat16 rounding a
    clipped grad, where fp32 masters' grads are float32.)"""
    adam = lambda ps: FusedAdam(ps, lr=1e-3)  # noqa: E731
    params = []
    for master_weights in (True, "remainder"):
        with settings.patch(half_dtype="bf16", master_weights=master_weights):
            accelerator, model, opt, loader, sched = accelerated(ApexPlugin(opt_level="O2"), optimizer=adam)
            run(accelerator, model, opt, loader, sched, clip=None)
        params.append(task.flat(model.parameters()))
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert torch.equal(params[0], params[1])
    inner = opt.optimizer
    assert inner.master_weights == "remainder" and any("master_remainder" in s for s in inner.state.values())


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="opt_level='O7': expected one of O0, O1, O2, O3"):
        ApexPlugin(opt_level="O7")
    with pytest.raises(ValueError, match="half_dtype='fp8': expected fp16 or bf16"):
        ApexPlugin(half_dtype="fp8")
    with pytest.raises(ValueError, match="message_size=0: expected an int > 0"):
        ApexPlugin(message_size=0)
    with pytest.raises(ValueError, match="You can only pass one ApexPlugin"):
        Accelerator(kwargs_handlers=[ApexPlugin(), ApexPlugin()])
    with pytest.raises(ValueError, match="mixed_precision='bf16' .* must be 'no'"):
        Accelerator(mixed_precision="bf16", kwargs_handlers=[ApexPlugin()])


def test_o2_needs_the_optimizer_prepared_with_the_model_and_once():
    accelerator = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])
    model = task.conv_net(0)
    loose = torch.optim.SGD(task.conv_net(1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="needs the model prepared before or together with its optimizer"):
        accelerator.prepare(loose)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = accelerator.prepare(model)
    x, y = next(iter(task.loader()))
    with pytest.raises(RuntimeError, match="prepare the optimizer too"):
        accelerator.backward(F.cross_entropy(model(x), y))
    prepared = accelerator.prepare(opt)
    assert accelerator.prepare(prepared) is prepared  # the wrapper again: as Accelerate does
    with pytest.raises(ValueError, match="this optimizer was prepared already"):
        accelerator.prepare(opt)


def test_a_call_may_list_the_optimizer_before_its_model():
    accelerator = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])
    model = task.conv_net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt, model = accelerator.prepare(opt, model)
    assert opt.param_groups[0]["params"][0].dtype == torch.float32  # a master
    assert model[0].weight.dtype == torch.float16


def test_the_patch_is_idempotent_and_undone():
    wrapped = Accelerator.__init__
    assert _compat.install() == [] and Accelerator.__init__ is wrapped
    _compat.uninstall()
    try:
        with pytest.raises((KeyError, AssertionError)):
            Accelerator(kwargs_handlers=[ApexPlugin()])  # Accelerate's own refusal of a foreign handler
    finally:
        assert _compat.install() == []
    assert getattr(Accelerator.__init__, _compat._MARK)


@pytest.mark.parametrize("level", [None, "O2"])
def test_the_runner_switches_the_plugin_on_only_with_its_variable(level, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_OPS_OPT")}
    if level:
        env["CORE_OPS_OPT_LEVEL"] = level
    proc = subprocess.run([sys.executable, "-m", "core_ops_accelerate", str(HERE / "plain_train.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=dict(env, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = torch.load(tmp_path / "plain-rank0.pt", weights_only=False)
    assert r["dtypes"] == (["torch.float16", "torch.float32"] if level else ["torch.float32"])


def test_clip_grad_value_clamps_the_unscaled_master_grads():
    accelerator, model, opt, loader = accelerated(ApexPlugin(opt_level="O2"), scheduler=False)
    x, y = next(iter(loader))
    accelerator.backward(F.cross_entropy(model(x), y))
    accelerator.unscale_gradients()
    grads = [p.grad.clone() for g in opt.param_groups for p in g["params"]]
    accelerator.clip_grad_value_(model.parameters(), 1e-3)
    for p, g in zip((p for g in opt.param_groups for p in g["params"]), grads):
        assert torch.equal(p.grad, g.clamp(-1e-3, 1e-3))  # masters' grads, unscaled once
    assert max(g.abs().max() for g in grads) > 1e-3


def test_an_unknown_accelerate_is_left_unpatched(monkeypatch):
    _compat.uninstall()
    try:
        monkeypatch.setattr(_compat, "problems", lambda: ["accelerate 9.9 is outside the supported [1.15, 2)"])
        assert _compat.install() == ["accelerate 9.9 is outside the supported [1.15, 2)"]
        assert not getattr(Accelerator.__init__, _compat._MARK, False)
    finally:
        monkeypatch.undo()
        assert _compat.install() == []


@pytest.mark.parametrize("level", ["O0", "O3"])
def test_a_nan_step_is_skipped_by_default_at_the_static_levels(level):
    """skip_nonfinite is on in ApexPlugin: at O0 / O3 (Apex's static scale of 1, which
    checks nothing) a NaN step is skipped too, the schedule held, and training goes on."""
    accelerator, model, opt, loader, sched = accelerated(ApexPlugin(opt_level=level, half_dtype="bf16"))
    params = []
    for i, (x, y) in enumerate(loader):
        with accelerator.autocast():
            loss = F.cross_entropy(model(x), y) * (float("nan") if i == 2 else 1.0)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        params.append(task.flat(model.parameters()))
        assert accelerator.optimizer_step_was_skipped == (i == 2)
    assert torch.equal(params[1], params[2]) and torch.isfinite(params[-1]).all()
    assert accelerator.core_ops_apex.skipped_steps == 1


def test_persistent_nan_stops_the_run_naming_the_grads_and_the_environment_turns_it_off(monkeypatch):
    from core_ops.amp import NonFiniteTraining
    accelerator, model, opt, loader, _ = accelerated(ApexPlugin(opt_level="O3", half_dtype="bf16",
                                                                max_consecutive_skips=3))
    with pytest.raises(NonFiniteTraining, match=r"3 steps in a row were skipped .* 0\.weight \(8, 1, 3, 3\): 72 of 72"):
        for x, y in loader:
            accelerator.backward(F.cross_entropy(model(x), y) * float("nan"))
            opt.step()
            opt.zero_grad()
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    monkeypatch.setenv("CORE_OPS_SKIP_NONFINITE", "0")
    accelerator, model, opt, loader, _ = accelerated(ApexPlugin(opt_level="O3", half_dtype="bf16"))
    for x, y in loader:  # off: Apex's behaviour, the NaN reaches the weights
        accelerator.backward(F.cross_entropy(model(x), y) * float("nan"))
        opt.step()
        opt.zero_grad()
    assert not torch.isfinite(task.flat(model.parameters())).all()
    monkeypatch.setenv("CORE_OPS_MAX_CONSECUTIVE_SKIPS", "many")
    with pytest.raises(ValueError, match="CORE_OPS_MAX_CONSECUTIVE_SKIPS='many': expected an int >= 1, or 0"):
        ApexPlugin()
