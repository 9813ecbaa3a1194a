"""A fused optimizer op given one step tensor for two params raises, naming both, and
writes nothing: the CPU kernels would advance a shared count once per param, the CUDA
ones race on it (core_ops' optimizers keep one step tensor per param)."""

import pytest
import torch

import core_ops  # noqa: F401
from core_ops import native
from core_ops.reference import KERNELS as REF
from core_ops._schemas import op


def adam_call(kernel, step_a, step_b):
    params = [torch.ones(3), torch.ones(5)]
    grads = [torch.full((3,), 0.5), torch.full((5,), 0.5)]
    m, v = [torch.zeros(3), torch.zeros(5)], [torch.zeros(3), torch.zeros(5)]
    kernel(params, grads, m, v, [], [], [step_a, step_b], 1e-2, 0.9, 0.999, 1e-8, 0.0,
           True, True, False, False, None, None, None)
    return params, m, v


@pytest.mark.parametrize("kind", ["native", "reference"])
def test_one_step_tensor_for_two_params_is_rejected(kind):
    kernel = op("fused_adam_") if kind == "native" else REF["fused_adam_"]
    if kind == "native":
        assert native.ensure("cpu").native
    shared = torch.zeros(())
    with pytest.raises(ValueError, match=r"steps\[0\] and steps\[1\] share memory, and the op writes both"):
        adam_call(kernel, shared, shared)
    assert shared.item() == 0  # nothing written

    params, m, _ = adam_call(kernel, torch.zeros(()), torch.zeros(()))  # distinct: fine
    assert params[0][0].item() == pytest.approx(1 - 1e-2, rel=1e-5)  # first Adam step moves lr
    assert m[1][0].item() == pytest.approx(0.05, rel=1e-6)
