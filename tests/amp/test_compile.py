"""torch.compile over core_ops (issue 35, first part): a model holding Linear, conv,
BatchNorm, FusedLayerNorm, FusedRMSNorm, fused_add_rms_norm, Apex's MixedFusedLayerNorm
(through the `apex` alias) and core_ops.mlp traces as one graph (no graph break,
``torch._dynamo.explain``) at every opt level in fp16 and bf16, compiled after
``amp.initialize`` or before it; ``fullgraph=True`` forward and backward equal eager;
and the whole amp train step with every fused optimizer skips an overflow as eager
does (each optimizer's own compiled step: tests/optimizers/test_optimizer_compile.py).

Compiled runs use the aot_eager backend: it runs dynamo and AOTAutograd over the ops'
fake kernels and autograd formulas (what breaks graphs) without inductor's C++
codegen, which fails on half weights on the CPU in torch 2.14 (torch's bug; issue 35).
Tolerances: aot_eager runs the same kernels as eager in the same order, so results are
equal bit for bit."""

import pytest
import torch
from torch import nn

from core_ops import amp
from core_ops.mlp import MLP
from core_ops.normalization import FusedLayerNorm, FusedRMSNorm, fused_add_rms_norm
from core_ops.optimizers import FusedAdam

from compile_cases import TRACES_BACKWARD, TRAIN_OPTIMIZERS, TRAININGS, amp_training, key

LEVELS = [(level, half) for level in ("O0", "O1", "O2", "O3") for half in (torch.float16, torch.bfloat16)]


def apex_mixed_layer_norm(width):
    from core_ops.compat.apex import install
    install()
    from apex.normalization import MixedFusedLayerNorm
    return MixedFusedLayerNorm(width)


class Net(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 32)
        self.ln, self.rms, self.mixed = FusedLayerNorm(32), FusedRMSNorm(32), apex_mixed_layer_norm(32)
        self.weight = nn.Parameter(torch.ones(32))
        self.mlp = MLP([32, 16, 4])

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).flatten(1)
        h = self.rms(self.ln(self.fc(h)))
        h, residual = fused_add_rms_norm(self.mixed(h), h, self.weight.to(h.dtype))
        return self.mlp(h + residual)


def prepared(level, half, seed=0, compile_first=False):
    model = Net(seed)
    opt = FusedAdam(model.parameters(), lr=1e-3)
    if compile_first:
        model = torch.compile(model, backend="aot_eager", fullgraph=True)
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0)
    return model, opt


def breaks(fn, *args):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    return explained.graph_count, [str(b.reason).splitlines()[0] for b in explained.break_reasons]


@pytest.mark.parametrize("level,half", LEVELS, ids=[f"{lv}-{str(h)[6:]}" for lv, h in LEVELS])
def test_every_opt_level_traces_as_one_graph(level, half):
    model, _ = prepared(level, half)
    assert breaks(model, torch.randn(2, 3, 4, 4)) == (1, [])


@pytest.mark.parametrize("level,half", [("O2", torch.bfloat16), ("O2", torch.float16), ("O3", torch.bfloat16)],
                         ids=["O2-bf16", "O2-fp16", "O3-bf16"])
@pytest.mark.parametrize("compile_first", [False, True], ids=["compiled-after", "compiled-before"])
def test_fullgraph_forward_and_backward_equal_eager(level, half, compile_first):
    torch._dynamo.reset()
    eager, _ = prepared(level, half)
    compiled, _ = prepared(level, half, compile_first=compile_first)
    if not compile_first:
        compiled = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 3, 4, 4)
    outs = []
    for model in (eager, compiled):
        out = model(x)
        out.float().square().mean().backward()
        outs.append((out, [p.grad for p in model.parameters()]))
    assert outs[0][0].dtype == outs[1][0].dtype and torch.equal(outs[0][0], outs[1][0])
    for a, b in zip(outs[0][1], outs[1][1]):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


@pytest.mark.inductor_cpu
def test_a_half_model_with_twin_bias_grads_compiles_with_inductor_on_the_cpu(tmp_path, monkeypatch):
    """Note [Inductor's twin reductions] (tools/upstream/inductor_cpu_twin_reduction.py):
    two biases fed one gradient fail inductor's CPU codegen at bf16; amp at O2 patches
    it, and the compiled grads are eager's within a bf16 rounding. Each compile gets a
    fresh inductor cache: a kernel compiled with the patch would be reused without it."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).parents[2] / "tools" / "upstream" / "inductor_cpu_twin_reduction.py"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "unpatched"))
    unpatched = subprocess.run([sys.executable, str(script), "bf16"], capture_output=True, text=True, timeout=600,
                               env=env)
    assert unpatched.returncode == 1 and "conflicting declaration" in unpatched.stdout, unpatched.stdout[-500:]

    class TwoBiases(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x):
            return self.a(x) + self.b(x * 2)

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "patched"))
    eager, compiled = TwoBiases(), TwoBiases()
    eager = amp.initialize(eager, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    compiled = amp.initialize(compiled, opt_level="O2", half_dtype=torch.bfloat16, verbosity=0)
    torch._dynamo.reset()
    run = torch.compile(compiled)
    x = torch.randn(16, 64)
    for model in (eager, run):
        model(x).square().mean().backward()
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1.6e-2, atol=1e-3)  # inductor fuses: one bf16 rounding


@pytest.fixture(scope="module")
def compiled_train_steps(tmp_path_factory):
    """{case: the compiled whole-train-step run}, from a process of their own (see
    compile_cases.py for why)."""
    import subprocess
    import sys
    from pathlib import Path
    out = tmp_path_factory.mktemp("compiled") / "runs.pt"
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("compile_cases.py")), str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("name,level,half", TRAININGS, ids=[key(*case) for case in TRAININGS])
@pytest.mark.parametrize("compile_what", ["step", "train_step"])
def test_a_compiled_step_under_amp_skips_an_overflow_as_eager(compile_what, name, level, half, request):
    """Note [amp's flag in the step]: the fused step reads amp's overflow flag itself, so
    ``torch.compile(opt.step)`` and the whole train step (forward, scale_loss backward,
    step) trace with no graph break, skip the fourth step and back the scale off as
    eager does, equal bit for bit (aot_eager runs eager's kernels). At O0 / O3 nothing
    is scaled or skipped: the inf goes into the weights in both."""
    torch._dynamo.reset()
    if compile_what == "train_step" and not TRACES_BACKWARD:
        pytest.skip(f"torch {torch.__version__} has no trace_autograd_ops (2.11 on): backward() breaks the graph")
    if compile_what == "train_step":
        eager, compiled = request.getfixturevalue("compiled_train_steps")[key(name, level, half)]
    else:
        eager = amp_training("nothing", TRAIN_OPTIMIZERS[name], level, half)
        compiled = amp_training(compile_what, TRAIN_OPTIMIZERS[name], level, half)
    same = dict(rtol=0, atol=0, equal_nan=True)  # O0 / O3 train on NaN weights after the inf
    torch.testing.assert_close(torch.tensor(compiled[1]), torch.tensor(eager[1]), **same)
    assert compiled[2] == eager[2]
    for a, b in zip(eager[0], compiled[0]):
        torch.testing.assert_close(b, a, **same)
    if level in ("O1", "O2"):  # the overflow was skipped: finite weights
        assert all(torch.isfinite(p).all() for p in compiled[0])
