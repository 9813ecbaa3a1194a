"""core_ops' fused optimizers on params sharded by FSDP2 (DTensors), 2 gloo ranks (Note
[Sharded params] in core_ops/_sharded.py)."""

import torch
from _launch import run_ranks


def test_adam_sgd_adagrad_on_sharded_params_match_torch_optim():
    # Tolerance: the same float32 formulas over 4 steps; core_ops may fuse a*b + c into
    # one FMA where torch rounds twice (a few ulps).
    for result in run_ranks("sharded_optimizer_workers:elementwise_optimizers", timeout=180):
        for name, r in result.items():
            assert r["state_types"] == ["DTensor"], name  # saved by DCP as torch.optim's
            for ours, theirs in zip(r["ours"], r["torch"]):
                torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)


def test_optimizers_needing_whole_tensor_norms_refuse_sharded_params():
    errors = run_ranks("sharded_optimizer_workers:refusals", timeout=120)[0]
    assert "LAMB's trust ratio needs each whole tensor's norm" in errors["lamb"]
    assert "NovoGrad's second moment" in errors["novograd"]
    assert "clip with torch.nn.utils.clip_grad_norm_" in errors["clip"]
    assert errors["unchanged"]


def test_loss_scalers_skip_an_overflow_in_one_shard_on_every_rank():
    for result in run_ranks("sharded_optimizer_workers:under_loss_scalers", timeout=180):
        theirs, their_scale = result.pop("torch")
        assert their_scale == 2.0 ** 7  # one skipped step
        for name, (ours, our_scale) in result.items():
            assert our_scale == their_scale, name
            for a, b in zip(ours, theirs):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
