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


def test_loading_the_plugin_keeps_lightnings_logger():
    # The plugin imports both Lightning trees; each import pointed Lightning's shared
    # rank-zero logger at its own, so `logging.getLogger("lightning.pytorch")` stopped
    # governing Lightning's messages once the plugin loaded.
    import subprocess
    import sys
    code = ("import lightning.pytorch, core_ops_lightning, pytorch_lightning\n"
            "import lightning_utilities.core.rank_zero as m\nprint(m.log.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "lightning.pytorch.utilities.rank_zero"
