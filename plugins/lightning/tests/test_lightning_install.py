"""The plugin installs beside a supported Lightning and core_ops runs inside it."""

import importlib.metadata

import torch
from packaging.version import Version


def test_installed_with_supported_lightning():
    import lightning

    import core_ops
    import core_ops_lightning

    assert importlib.metadata.version("core-ops-lightning") == core_ops_lightning.__version__
    assert Version("2.6") <= Version(lightning.__version__) < Version("2.7")
    total, _ = core_ops.multi_tensor_l2norm([torch.full((4,), 2.0)])
    assert total.item() == 4.0
