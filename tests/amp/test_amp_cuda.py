"""On a GPU: the amp loop with a fused optimizer never syncs the host (torch's sync
debug mode turns any sync into an error), and O2 trains on CUDA like on CPU."""

import pytest
import torch
import torch.nn.functional as F

from amp_cases import batches, conv_net
from core_ops import amp
from core_ops.amp import LossScaler
from core_ops.optimizers import FusedAdam

pytestmark = pytest.mark.gpu


def _data(n):
    return [(x.cuda(), y.cuda()) for x, y in batches(n)]


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_o2_step_never_syncs(half):
    model = conv_net().cuda()
    opt = FusedAdam(model.parameters(), lr=3e-3)
    model, opt = amp.initialize(model, opt, opt_level="O2", half_dtype=half, verbosity=0)
    data = _data(30)
    losses = []
    for i, (x, y) in enumerate(data):
        torch.cuda.set_sync_debug_mode("error" if i > 2 else "default")  # after warm-up
        try:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        losses.append(loss.detach())
    assert float(losses[-1]) < 0.6 * float(losses[0])


def test_loss_scaler_with_fused_adam_never_syncs():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).cuda()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    scaler = LossScaler("cuda")
    x = torch.randn(32, 64, device="cuda")
    for i in range(5):
        torch.cuda.set_sync_debug_mode("error" if i > 0 else "default")
        try:
            opt.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert scaler.get_scale() == 2.0**16 and scaler.skipped_steps == 0
