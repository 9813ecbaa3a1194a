"""Apex's ``apex.fp16_utils``: mixed precision by hand, from before amp. A half
network with float32 BatchNorm (``FP16Model``, ``network_to_half``), fp32 master
params and the copies to and from them, loss scalers, and ``FP16_Optimizer``, which
wraps any optimizer (torch's or core_ops') to do all of it."""

from .fp16_optimizer import FP16_Optimizer
from .fp16util import (
    BN_convert_float,
    FP16Model,
    clip_grad_norm,
    convert_module,
    convert_network,
    master_params_to_model_params,
    model_grads_to_master_grads,
    network_to_half,
    prep_param_lists,
    to_python_float,
    tofp16,
)
from .loss_scaler import DynamicLossScaler, LossScaler

__all__ = [
    "BN_convert_float", "DynamicLossScaler", "FP16Model", "FP16_Optimizer", "LossScaler",
    "clip_grad_norm", "convert_module", "convert_network", "master_params_to_model_params",
    "model_grads_to_master_grads", "network_to_half", "prep_param_lists", "to_python_float",
    "tofp16",
]
