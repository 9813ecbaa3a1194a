from .fp16_optimizer import FP16_Optimizer
from .fused_adam import FusedAdam
from .fused_lamb import FusedLAMB
from .fused_sgd import FusedSGD

__all__ = ["FP16_Optimizer", "FusedAdam", "FusedLAMB", "FusedSGD"]
