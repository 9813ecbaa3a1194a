"""Apex's O1 registration functions: under O1's autocast a registered function runs in
the dtype asked for, with autocast off inside; outside autocast it is untouched."""

import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core_ops import amp


def user_module():
    """A stand-in for the module whose function a user registers."""
    seen = []

    def mix(a, b):
        seen.append((a.dtype, b.dtype, torch.is_autocast_enabled("cpu")))
        return a * b

    return types.SimpleNamespace(mix=mix), seen


@pytest.mark.parametrize("register, expected", [
    (amp.register_float_function, torch.float32),
    (amp.register_half_function, torch.bfloat16),
    (amp.register_promote_function, torch.float32),
])
def test_registered_function_under_o1(register, expected):
    mod, seen = user_module()
    register(mod, "mix")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)  # bf16 under autocast
            return mod.mix(h, x)  # x stays float32

    model = amp.initialize(Net(), opt_level="O1", half_dtype=torch.bfloat16, verbosity=0)
    out = model(torch.randn(3, 4))
    assert seen[-1] == (expected, expected, False)
    assert out.dtype == torch.float32  # O1 returns float32 outputs
    x = torch.randn(2, 2)
    mod.mix(x.bfloat16(), x)  # no autocast: runs as written (and promotes itself)
    assert seen[-1] == (torch.bfloat16, torch.float32, False)


def test_registering_twice_keeps_one_wrapper_and_bad_names_raise():
    mod, seen = user_module()
    amp.register_half_function(mod, "mix")
    amp.register_float_function(mod, "mix")
    assert not hasattr(mod.mix.__wrapped__, "__wrapped__")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mod.mix(torch.ones(2, 2), torch.ones(2, 2))
    assert seen[-1][:2] == (torch.float32, torch.float32)
    with pytest.raises(ValueError, match="has no function named 'nope'"):
        amp.register_float_function(F, "nope")


@pytest.mark.parametrize("decorator, expected", [
    (amp.half_function, (torch.float16, torch.float16)),
    (amp.float_function, (torch.float32, torch.float32)),
    (amp.promote_function, (torch.float32, torch.float32)),
])
def test_decorators_under_o1(decorator, expected):
    seen = []

    @decorator
    def mix(a, b):
        seen.append((a.dtype, b.dtype, torch.is_autocast_enabled("cpu")))
        return a * b

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return mix(self.lin(x), x)  # fp16 (autocast) and float32 arguments

    model = amp.initialize(Net(), opt_level="O1", verbosity=0)
    x = torch.randn(3, 4)
    out = model(x)
    assert seen[-1] == (*expected, False)
    with torch.no_grad():
        h = F.linear(x.half(), model.lin.weight.half(), model.lin.bias.half())
        want = h.to(expected[0]) * x.to(expected[0])
    assert torch.equal(out, want.float())
    mix(torch.ones(2).half(), torch.ones(2))  # no autocast: untouched
    assert seen[-1] == (torch.float16, torch.float32, False)
    assert mix.__name__ == "mix"
