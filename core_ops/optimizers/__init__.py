"""Fused optimizers with Apex's constructors: ``from apex.optimizers import X``
becomes ``from core_ops.optimizers import X``."""

from .compact_state import full_precision_state_dict
from .fused_adagrad import FusedAdagrad
from .fused_adam import FusedAdam
from .fused_lamb import FusedLAMB, FusedMixedPrecisionLamb
from .fused_novograd import FusedNovoGrad
from .fused_sgd import FusedSGD
from .larc import LARC
from .twins import fused_twin

__all__ = ["FusedAdagrad", "FusedAdam", "FusedLAMB", "FusedMixedPrecisionLamb", "FusedNovoGrad",
           "FusedSGD", "LARC", "full_precision_state_dict", "fused_twin"]
