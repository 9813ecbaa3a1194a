"""core-ops for Hugging Face Accelerate: Apex's opt levels, fp32 master weights and
core_ops' DistributedDataParallel in an unchanged Accelerate training loop::

    from accelerate import Accelerator
    from core_ops_accelerate import ApexPlugin
    accelerator = Accelerator(kwargs_handlers=[ApexPlugin(opt_level="O2")])

or, with no change to the script, from the environment, however it is launched
(``python train.py``, ``accelerate launch train.py``, ``torchrun train.py``): the
installed package loads itself when ``accelerate`` is imported and
``CORE_OPS_OPT_LEVEL`` is set (Note [Plugin autoload] in core_ops_autoload.py;
``CORE_OPS_AUTOLOAD=0`` turns that off, and ``python -m core_ops_accelerate`` still
works)::

    CORE_OPS_OPT_LEVEL=O2 accelerate launch --config_file cfg.yaml train.py
"""

import warnings

from . import _compat
from .plugin import FIELDS, ApexPlugin

__version__ = "0.1.0"

PROBLEMS = _compat.install()
if PROBLEMS:
    warnings.warn("core_ops_accelerate could not hook into this Accelerate (" + "; ".join(PROBLEMS) +
                  "): Accelerator(kwargs_handlers=[ApexPlugin()]) will be refused", stacklevel=2)



def autoload():
    """What the installed package's .pth calls once ``accelerate`` is imported with a
    ``CORE_OPS_*`` variable set: every Accelerator built without an ApexPlugin gets one
    when ``CORE_OPS_OPT_LEVEL`` is set, and an error when another variable of the plugin
    is set without it."""
    _compat.AUTO["on"] = True


__all__ = ["ApexPlugin", "FIELDS", "autoload"]
