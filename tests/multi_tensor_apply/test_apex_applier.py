"""Apex's calling convention: multi_tensor_applier(amp_C.op, noop_flag, lists, *args)."""

import torch

from core_ops.multi_tensor_apply import amp_C, multi_tensor_applier


def test_scale_through_applier_sets_noop_flag():
    noop = torch.zeros(1, dtype=torch.int32)
    src = [torch.tensor([1.0, 2.0]).half(), torch.tensor([float("inf")]).half()]
    dst = [torch.empty(2), torch.empty(1)]
    multi_tensor_applier(amp_C.multi_tensor_scale, noop, [src, dst], 0.5)
    assert torch.equal(dst[0], torch.tensor([0.5, 1.0])) and noop.item() == 1


def test_axpby_through_applier():
    noop = torch.zeros(1, dtype=torch.int32)
    x, y, out = [torch.ones(4)], [torch.full((4,), 2.0)], [torch.empty(4)]
    multi_tensor_applier(amp_C.multi_tensor_axpby, noop, [x, y, out], 3.0, -1.0, -1)
    assert torch.equal(out[0], torch.ones(4)) and noop.item() == 0


def test_l2norm_shapes_match_apex():
    ts = [torch.full((4,), 1.5), torch.full((16,), 1.0)]  # norms 3 and 4, together 5
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm, torch.zeros(1, dtype=torch.int32), [ts], True)
    assert total.shape == (1,) and total.item() == 5.0
    assert torch.equal(per, torch.tensor([3.0, 4.0]))


def test_unscale_l2norm_does_not_write_like_apex():
    ts = [torch.full((16,), 4.0)]
    total, _ = multi_tensor_applier(amp_C.multi_tensor_unscale_l2norm, torch.zeros(1, dtype=torch.int32),
                                    [ts], torch.tensor([0.5]), False)
    assert total.item() == 8.0 and torch.equal(ts[0], torch.full((16,), 4.0))


def test_update_scale_hysteresis():
    scale, growth, hyst = torch.tensor([1024.0]), torch.zeros(1, dtype=torch.int32), torch.full((1,), 2, dtype=torch.int32)
    for _ in range(2):
        amp_C.update_scale_hysteresis(scale, growth, hyst, torch.ones(1), 2.0, 0.5, 2000, 2)
    assert scale.item() == 512.0 and hyst.item() == 0


def test_amp_C_from_multi_tensor_apply_is_apex_extensions_and_installs_no_alias():
    """amp_C lives in core_ops.compat.apex_extensions; the migration guide's spelling
    ``from core_ops.multi_tensor_apply import amp_C`` gives that module without making
    ``import apex`` resolve (a real Apex installed beside core-ops stays reachable)."""
    import subprocess
    import sys
    code = ("import sys; from core_ops.multi_tensor_apply import amp_C; "
            "import core_ops.compat.apex_extensions.amp_C as home; "
            "print(amp_C is home, 'core_ops.compat.apex' in sys.modules, "
            "any(type(f).__name__ == 'ApexAliasFinder' for f in sys.meta_path))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.stdout.split() == ["True", "False", "False"], run.stderr[-2000:]
