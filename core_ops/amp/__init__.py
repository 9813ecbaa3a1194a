"""Apex's automatic mixed precision (opt levels O0-O3, ``initialize`` /
``scale_loss``) on torch.autocast and core_ops' multi-tensor ops, fp16 or bf16, on
CPU and CUDA; and ``LossScaler``, a drop-in ``torch.amp.GradScaler`` that keeps the
whole scaling loop on the device.

Reading the loss scaling, e.g. for logging (each a host sync)::

    amp.loss_scale(loss_id=0)     # the current scale of loss scaler 0, a float
    amp.skipped_steps(loss_id=0)  # iterations it skipped for inf/nan grads, an int
    amp.grad_report()             # each param's grad: non-finite elements, max |finite|

Apex's spelling ``amp._amp_state.loss_scalers[0].loss_scale()`` works too. User
functions take O1's casts with the decorators ``@amp.half_function``,
``@amp.float_function`` and ``@amp.promote_function`` (or, for a function of a module,
``amp.register_half_function(module, name)`` and its siblings).
"""

from ._state import _amp_state  # noqa: F401  (Apex's name, for its logging idiom)
from .frontend import initialize
from .fsdp import fsdp_policy
from .legacy_init import AmpHandle, DisabledInitHandle, init
from .handle import (disable_casts, grad_report, load_state_dict, loss_scale, master_params, scale_loss,
                     skipped_steps, state_dict)
from .loop import AmpLoop
from .loss_scaler import GradScaler, LossScaler
from .opt_levels import OPT_LEVELS, Properties
from .skip_watch import NonFiniteTraining
from .registry import (float_function, half_function, promote_function, register_float_function,
                       register_half_function, register_promote_function)

__all__ = ["AmpHandle", "AmpLoop", "DisabledInitHandle", "NonFiniteTraining", "init", "GradScaler", "LossScaler", "OPT_LEVELS", "Properties", "disable_casts",
           "float_function", "fsdp_policy", "grad_report", "half_function", "initialize", "load_state_dict", "loss_scale",
           "master_params", "promote_function", "register_float_function",
           "register_half_function", "register_promote_function", "scale_loss", "skipped_steps",
           "state_dict"]



def __getattr__(name):
    raise AttributeError(f"module 'core_ops.amp' has no attribute {name!r}")
