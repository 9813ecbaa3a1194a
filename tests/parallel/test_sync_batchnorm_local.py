"""SyncBatchNorm in one process (no process group: world size 1): numerics against
torch's BatchNorm per dtype and layout, Welford's stability, eval mode, conversion,
state dicts and bad input. The multi-rank behaviour is in test_sync_batchnorm.py."""

import pytest
import torch
from torch import nn

from conftest import dtype_id
from core_ops.parallel import SyncBatchNorm, convert_syncbn_model

LAYOUTS = ["contiguous", "channels_last", "apex_channel_last"]


def _inputs(dtype, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 5, 7, 9, generator=g, dtype=torch.float64) * 2 + 3
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    x = x.to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return x, dy


def _run(module, x, dy, layout):
    """Output, input grad, weight grad, bias grad, all in (N, C, H, W) terms."""
    x = x.detach()
    if layout == "apex_channel_last":
        x = x.movedim(1, -1).contiguous()
    x.requires_grad_()
    y = module(x)
    if layout == "apex_channel_last":
        y = y.movedim(-1, 1)
    (y.double() * dy).sum().backward()
    gx = x.grad.movedim(-1, 1) if layout == "apex_channel_last" else x.grad
    return [t.double() for t in (y.detach(), gx, module.weight.grad, module.bias.grad)]


def _pair(channel_last=False):
    ref = nn.BatchNorm2d(5)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))
        ref.bias.uniform_(-1, 1, generator=torch.Generator().manual_seed(4))
    ours = SyncBatchNorm(5, channel_last=channel_last)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_error_at_most_torch_batchnorm_error(dtype, layout):
    """Against float64 truth on the same (rounded) input and fp32 weights (Apex's
    keep_batchnorm_fp32), our error is at most twice torch's BatchNorm error in the
    same dtype, plus one ulp of the output dtype at the output's scale (Note [Test
    tolerances] in tests/conftest.py; both accumulate in float32)."""
    x, dy = _inputs(dtype, layout)
    ref, ours = _pair(channel_last=layout == "apex_channel_last")
    exact = ref.double()
    truth = _run(exact, x.double(), dy, "contiguous")
    ref, _ = _pair()
    theirs = _run(ref, x, dy, "channels_last" if layout == "channels_last" else "contiguous")
    mine = _run(ours, x, dy, layout)
    eps = torch.finfo(dtype).eps
    for name, t, o, m in zip(("out", "grad_in", "grad_weight", "grad_bias"), truth, theirs, mine):
        err_torch = (o - t).abs().max().item()
        err_ours = (m - t).abs().max().item()
        assert err_ours <= 2 * err_torch + eps * t.abs().max().item(), (name, err_ours, err_torch)
    assert torch.allclose(ours.running_var.double(), exact.running_var, rtol=1e-5)
    assert torch.allclose(ours.running_mean.double(), exact.running_mean, rtol=1e-5, atol=1e-6)


def test_welford_is_stable_far_from_zero():
    """Mean 1e4, variance 1: E[x^2] - E[x]^2 in float32 would lose every digit (1e8
    against an ulp of 8); Welford keeps the variance to ~1e-5 relative."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 3, 1000, generator=g, dtype=torch.float64) + 1e4).float()
    mean, var = torch.ops.core_ops.sync_batch_norm_stats(x)
    var64, mean64 = torch.var_mean(x.double(), dim=(0, 2), correction=0)
    assert (var.double() - var64).abs().max().item() <= 1e-4 * var64.max().item()
    assert (mean.double() - mean64).abs().max().item() <= 1e-3  # ulp(1e4) = 1e-3 in float32


def test_momentum_none_and_eval_without_process_group():
    ref, ours = _pair()
    ref.momentum = ours.momentum = None
    for seed in range(3):
        x, _ = _inputs(torch.float32, "contiguous", seed)
        ref(x)
        ours(x)
    assert torch.allclose(ours.running_mean, ref.running_mean, rtol=1e-6, atol=1e-6)
    assert torch.allclose(ours.running_var, ref.running_var, rtol=1e-6)
    assert int(ours.num_batches_tracked) == 3
    ref.eval()
    ours.eval()
    x, _ = _inputs(torch.float32, "contiguous", 7)
    torch.testing.assert_close(ours(x), ref(x))


def test_no_running_stats_uses_batch_stats_in_eval():
    ref = nn.BatchNorm1d(4, track_running_stats=False).eval()
    ours = SyncBatchNorm(4, track_running_stats=False).eval()
    x = torch.randn(10, 4, 3)
    torch.testing.assert_close(ours(x), ref(x))


def test_convert_syncbn_model_keeps_weights_buffers_and_mode():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
                          nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2, momentum=None)))
    with torch.no_grad():
        model[1].weight.fill_(2.0)
        model[1].running_mean.fill_(0.5)
    model[2].eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    converted = convert_syncbn_model(model, channel_last=False)
    assert isinstance(converted[1], SyncBatchNorm) and isinstance(converted[2][1], SyncBatchNorm)
    assert converted[2][1].momentum is None and not converted[2][1].training
    after = converted.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert isinstance(convert_syncbn_model(nn.BatchNorm3d(2)), SyncBatchNorm)
    bn = nn.BatchNorm2d(4)
    bn.load_state_dict(converted[1].state_dict())  # and back into torch's BatchNorm
    assert torch.equal(bn.weight, converted[1].weight)
    qat = nn.BatchNorm1d(2)
    qat.qconfig = "a quantization config"  # kept for quantization-aware training, as torch does
    assert convert_syncbn_model(qat).qconfig == "a quantization config"


def test_double_backward_matches_batchnorm():
    """A gradient penalty through SyncBatchNorm in one process (Note [SyncBN double
    backward]): the second-order grads of torch's BatchNorm, float64."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    results = []
    for module in (nn.BatchNorm1d(3), SyncBatchNorm(3)):
        module = module.double()
        with torch.no_grad():
            module.weight.copy_(torch.tensor([0.5, 1.0, 1.5]))
        x = x0.clone().requires_grad_()
        gx, = torch.autograd.grad(module(x).pow(3).sum(), x, create_graph=True)
        penalty = gx.pow(2).sum()
        penalty.backward()
        results.append((gx.detach(), x.grad, module.weight.grad, module.bias.grad))
    assert results[0][1].abs().sum() > 1  # a second-order grad that is not zero
    for ref, ours in zip(*results):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_empty_batch_keeps_running_stats():
    ref, ours = nn.BatchNorm2d(3), SyncBatchNorm(3)
    for m in (ref, ours):
        with torch.no_grad():
            m.running_mean.fill_(2.0)
            m.running_var.fill_(3.0)
        assert m(torch.empty(0, 3, 4, 4)).shape == (0, 3, 4, 4)
    assert ours.running_mean.tolist() == ref.running_mean.tolist() == [2.0] * 3
    assert ours.running_var.tolist() == ref.running_var.tolist() == [3.0] * 3


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4, 5, 6, 7)])
def test_wrong_input_rank(shape):
    with pytest.raises(ValueError, match="2D to 5D input"):
        SyncBatchNorm(3)(torch.randn(shape))


def test_wrong_channels_and_single_value():
    with pytest.raises(ValueError, match="num_features is 3"):
        SyncBatchNorm(3)(torch.randn(2, 4, 5))
    with pytest.raises(ValueError, match="num_features is 3"):
        SyncBatchNorm(3, channel_last=True)(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        SyncBatchNorm(3)(torch.randn(1, 3))


def test_a_module_pickled_before_fuse_relu_existed_still_runs():
    import pickle
    bn = SyncBatchNorm(3)
    del bn.__dict__["fuse_relu"]  # as unpickled from before the option
    bn = pickle.loads(pickle.dumps(bn))
    x = torch.randn(4, 3, 2)
    torch.testing.assert_close(bn(x), nn.functional.batch_norm(x, None, None, training=True))
    assert "fuse_relu=False" in repr(bn)


def test_revert_gives_back_the_batch_norms_it_was_converted_from():
    from core_ops.parallel import SyncBatchNorm, revert_syncbn_model
    from core_ops.parallel.convert import BatchNormAnyDim
    model = torch.nn.Sequential(torch.nn.Conv1d(2, 3, 1), torch.nn.BatchNorm1d(3), torch.nn.Conv2d(3, 3, 1),
                                torch.nn.BatchNorm2d(3), SyncBatchNorm(3))
    model[3].eval()
    weight = model[3].weight
    converted = convert_syncbn_model(model)
    assert all(isinstance(converted[i], SyncBatchNorm) for i in (1, 3, 4))
    back = revert_syncbn_model(converted)
    assert [type(back[i]) for i in (1, 3, 4)] == [torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, BatchNormAnyDim]
    assert back[3].weight is weight and not back[3].training and back[1].training
    x = torch.randn(4, 3, 5, 5)
    assert torch.equal(back[4](x), torch.nn.functional.batch_norm(x, None, None, training=True))
