"""The Accelerate plugin on one GPU (run by tests/gpu/run.sh; skipped without a GPU):
ApexPlugin(opt_level="O2") trains the shared small task on CUDA with fp16 weights
and fp32 BatchNorm, as a hand-written AmpLoop on the same GPU does, bit for bit (cuDNN
deterministic), and an overflowed step is skipped with the scale halved."""

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
from core_ops_accelerate import ApexPlugin  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(autouse=True)
def _fresh_state_and_deterministic(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def hand_written_on_gpu():
    loop = AmpLoop("O2", half_dtype=torch.float16)
    model = loop.prepare_model(task.conv_net(0).cuda())
    opt = loop.attach(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    for x, y in task.loader():
        with loop.autocast("cuda"):
            loss = F.cross_entropy(model(x.cuda()), y.cuda())
        loop.scale(loss).backward()
        loop.unscale_(opt)
        loop.step(opt)
        loop.update()
        opt.zero_grad()
    return model, loop


def test_the_plugin_trains_on_a_gpu_as_a_hand_written_loop():
    accelerator = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])
    assert accelerator.device.type == "cuda"
    model = task.conv_net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, task.loader())
    for x, y in loader:
        with accelerator.autocast():
            loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    net = accelerator.unwrap_model(model)
    assert net[0].weight.is_cuda and net[0].weight.dtype == torch.float16 and net[1].weight.dtype == torch.float32
    theirs, _ = hand_written_on_gpu()
    assert torch.equal(task.flat(net.parameters()), task.flat(theirs.parameters()))


def test_an_overflow_on_the_gpu_skips_the_step():
    accelerator = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])
    model = task.conv_net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, task.loader())
    params = []
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) * (float("inf") if i == 2 else 1.0)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        params.append(task.flat(model.parameters()))
        assert accelerator.optimizer_step_was_skipped == (i == 2)
    assert torch.equal(params[1], params[2])
    assert accelerator.core_ops_apex.skipped_steps == 1 and accelerator.core_ops_apex.loss_scale_value == 2.0**15
