"""Cases of tests/amp/test_compile.py: the six-step amp training runs compared eager /
compiled, with every fused optimizer of the registry (tests/optimizers/optimizer_registry.py,
generic test "amp_compile"; each optimizer's own compiled step:
tests/optimizers/test_optimizer_compile.py). Run as a script, it runs the whole compiled
train steps (``python compile_cases.py OUT``) and saves their results in OUT: the
test runs them in a process of their own because torch 2.14's dynamo, after tracing
an O2 ``scale_loss`` backward with ``trace_autograd_ops``, keeps a reference to that
frame's model that a later compile in the same process fails on ("'model' not in
cell_and_freevars"; tools/upstream/dynamo_stale_frame_after_backward.py)."""

import contextlib
import sys
from pathlib import Path

import torch
from torch import nn

from core_ops import amp

sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers"))
from optimizer_registry import cases  # noqa: E402

TRAIN_OPTIMIZERS = {case.id: case.values[0].make for case in cases("amp_compile")}
# dynamo's switch to trace backward() came in torch 2.11; on 2.10 a compiled train step
# breaks its graph at backward() (docs/compile.md), and only the step compiles whole.
TRACES_BACKWARD = hasattr(torch._dynamo.config, "trace_autograd_ops")


def amp_training(compile_what, make=TRAIN_OPTIMIZERS["adam"], level="O2", half=torch.bfloat16):
    """Six steps with an overflow at the fourth: params, losses, amp's state dict. The
    whole train step compiles with fullgraph=True (no graph break) with dynamo's
    ``trace_autograd_ops``, without which torch breaks every graph at ``backward()``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = make(model.parameters())
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0)
    step = torch.compile(opt.step, backend="aot_eager", fullgraph=True) if compile_what == "step" else opt.step

    def train_step(x, y, boost):
        loss = torch.nn.functional.mse_loss(model(x).float(), y) * boost
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        step()
        return loss.detach()

    run = train_step
    if compile_what == "train_step":
        run = torch.compile(train_step, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(1)
    losses = []
    tracing = torch._dynamo.config.patch(trace_autograd_ops=True) if TRACES_BACKWARD else contextlib.nullcontext()
    with tracing:
        for i in range(6):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            losses.append(float(run(x, y, torch.tensor(float("inf") if i == 3 else 1.0))))
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()], losses, amp.state_dict()


TRAININGS = [(name, "O2", torch.bfloat16) for name in TRAIN_OPTIMIZERS] + [
    ("adam", "O2", torch.float16), ("adam", "O1", torch.float16), ("adam", "O1", torch.bfloat16),
    ("adam", "O3", torch.bfloat16), ("adam", "O0", torch.float16)]



def key(name, level, half):
    return f"{name}-{level}-{str(half)[6:]}"


def compiled_train_steps():
    """{case: (eager run, compiled run)}, both in this process: float32 matmuls can
    round differently in another process (the BLAS's blocking follows alignment)."""
    runs = {}
    for name, *rest in TRAININGS if TRACES_BACKWARD else []:
        torch._dynamo.reset()  # each case compiles train_step's code afresh (recompile limit)
        runs[key(name, *rest)] = tuple(amp_training(what, TRAIN_OPTIMIZERS[name], *rest)
                                       for what in ("nothing", "train_step"))
    return runs


if __name__ == "__main__":
    torch.save(compiled_train_steps(), sys.argv[1])
