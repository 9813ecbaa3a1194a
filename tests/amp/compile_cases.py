"""Cases of tests/amp/test_compile.py: the fused optimizers and the six-step amp
training runs compared eager / compiled. Run as a script, it runs the whole compiled
train steps (``python compile_cases.py OUT``) and saves their results in OUT: the
test runs them in a process of their own because torch 2.14's dynamo, after tracing
an O2 ``scale_loss`` backward with ``trace_autograd_ops``, keeps a reference to that
frame's model that a later compile in the same process fails on ("'model' not in
cell_and_freevars"; tools/upstream/dynamo_stale_frame_after_backward.py)."""

import sys

import torch
from torch import nn

from core_ops import amp
from core_ops.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedNovoGrad, FusedSGD

OPTIMIZERS = {
    "adam": (lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01), torch.float32),
    "adam-fp32-masters": (lambda ps: FusedAdam(ps, lr=1e-3, master_weights=True), torch.bfloat16),
    "adam-remainders-8bit": (lambda ps: FusedAdam(ps, lr=1e-3, master_weights="remainder", state_dtype="int8",
                                                  min_8bit_size=1), torch.bfloat16),
    "sgd": (lambda ps: FusedSGD(ps, lr=0.1, momentum=0.9), torch.float32),
    "lamb": (lambda ps: FusedLAMB(ps, lr=1e-3), torch.float32),
    "novograd": (lambda ps: FusedNovoGrad(ps, lr=1e-3), torch.float32),
    "adagrad": (lambda ps: FusedAdagrad(ps, lr=0.1), torch.float32),
}


TRAIN_OPTIMIZERS = {name: make for name, (make, _) in OPTIMIZERS.items() if name in ("adam", "sgd", "lamb",
                                                                                "novograd", "adagrad")}


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
    with torch._dynamo.config.patch(trace_autograd_ops=True):
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
    for name, *rest in TRAININGS:
        torch._dynamo.reset()  # each case compiles train_step's code afresh (recompile limit)
        runs[key(name, *rest)] = tuple(amp_training(what, TRAIN_OPTIMIZERS[name], *rest)
                                       for what in ("nothing", "train_step"))
    return runs


if __name__ == "__main__":
    torch.save(compiled_train_steps(), sys.argv[1])
