"""Every fused optimizer of the registry (optimizer_registry.py, generic test
"apex_alias") through the Apex alias (``import core_ops.compat.apex``): the import path
an Apex script uses (``apex.optimizers.fused_adam.FusedAdam``) and its short form
(``apex.optimizers.FusedAdam``) give the core_ops class, and an optimizer built by that
name with the entry's kwargs steps on each device as the core_ops one does."""

import importlib

import pytest
import torch
from optim_cases import DEVICES, make_params, run
from optimizer_registry import cases


@pytest.mark.parametrize("info", cases("apex_alias"))
@pytest.mark.parametrize("device", DEVICES)
def test_the_apex_import_path_gives_the_class_which_steps(device, info):
    import core_ops.compat.apex  # noqa: F401  (the alias)
    module, name = info.apex_alias.rsplit(".", 1)
    assert name == info.cls.__name__
    apex_class = getattr(importlib.import_module(module), name)
    assert apex_class is info.cls is getattr(importlib.import_module("apex.optimizers"), name)
    ours, theirs = (make_params(info.typical.dtype, sizes=(300, 17), device=device) for _ in range(2))
    apex_opt = apex_class(theirs, **info.typical.kwargs)
    run(info.make(ours), ours, steps=3)
    run(apex_opt, theirs, steps=3)
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))
