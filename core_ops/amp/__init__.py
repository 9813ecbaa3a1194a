"""Apex's automatic mixed precision (opt levels O0-O3, ``initialize`` /
``scale_loss``) on torch.autocast and core_ops' multi-tensor ops, fp16 or bf16, on
CPU and CUDA; and ``LossScaler``, a drop-in ``torch.amp.GradScaler`` that keeps the
whole scaling loop on the device."""

from .frontend import initialize
from .handle import disable_casts, load_state_dict, master_params, scale_loss, state_dict
from .loss_scaler import GradScaler, LossScaler
from .opt_levels import OPT_LEVELS, Properties
from .registry import register_float_function, register_half_function, register_promote_function

__all__ = ["GradScaler", "LossScaler", "OPT_LEVELS", "Properties", "disable_casts", "initialize",
           "load_state_dict", "master_params", "register_float_function", "register_half_function",
           "register_promote_function", "scale_loss", "state_dict"]
