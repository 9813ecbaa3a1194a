"""The plugin installs beside a supported Accelerate and core_ops runs inside it."""

import importlib.metadata

import torch
from packaging.version import Version


def test_installed_with_supported_accelerate():
    import accelerate

    import core_ops
    import core_ops_accelerate

    assert importlib.metadata.version("core-ops-accelerate") == core_ops_accelerate.__version__
    assert Version("1.15") <= Version(accelerate.__version__) < Version("2")
    total, _ = core_ops.multi_tensor_l2norm([torch.full((9,), 1.0)])
    assert total.item() == 3.0
