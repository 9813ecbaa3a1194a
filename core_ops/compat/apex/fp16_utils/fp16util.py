"""Apex's ``fp16_utils`` helpers for hand-written mixed precision: a network in half
precision with its affine BatchNorm kept in float32, fp32 master copies of its params,
and the copies between the two. ``FP16_Optimizer`` (fp16_optimizer.py) does all of it
for an optimizer; these are for scripts that do it by hand."""

from __future__ import annotations

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .._clip import clip_grad_norm_

# Apex exported torch's clip under this name; ours takes the same arguments and norms
# the grads in one multi-tensor pass.
clip_grad_norm = clip_grad_norm_


def _keeps_float(module):
    # Affine BatchNorm stays float32: its running variance and affine params need the range.
    return isinstance(module, nn.modules.batchnorm._BatchNorm) and module.affine


class tofp16(nn.Module):
    """``forward(input) = input.half()``: the first layer of ``network_to_half``."""

    def forward(self, input):
        return input.half()


def BN_convert_float(module):
    """Puts ``module``'s affine BatchNorm layers back in float32; returns ``module``."""
    for m in module.modules():
        if _keeps_float(m):
            m.float()
    return module


def network_to_half(network):
    """``network`` in half precision, affine BatchNorm in float32, behind a layer that
    casts its input to half."""
    return nn.Sequential(tofp16(), BN_convert_float(network.half()))


def convert_module(module, dtype):
    """Casts ``module``'s own floating-point params (and their grads) and buffers to
    ``dtype``, in place; its children are left alone."""
    for param in module.parameters(recurse=False):
        if param.is_floating_point():
            param.data = param.data.to(dtype)
            if param.grad is not None and param.grad.is_floating_point():
                param.grad.data = param.grad.data.to(dtype)
    for buf in module.buffers(recurse=False):
        if buf.is_floating_point():
            buf.data = buf.data.to(dtype)


def convert_network(network, dtype):
    """Casts every module of ``network`` to ``dtype`` except affine BatchNorm, in place
    (RNNs get their weights re-flattened); returns ``network``."""
    for module in network.modules():
        if _keeps_float(module):
            continue
        convert_module(module, dtype)
        if isinstance(module, nn.RNNBase):
            module.flatten_parameters()
    return network


class FP16Model(nn.Module):
    """``network`` in half precision (affine BatchNorm in float32) whose forward casts
    its floating-point inputs to half. Integer inputs (token ids) pass as they are:
    Apex cast every input, which breaks an embedding's indices."""

    def __init__(self, network):
        super().__init__()
        self.network = convert_network(network, dtype=torch.half)

    def forward(self, *inputs):
        return self.network(*(t.half() if torch.is_tensor(t) and t.is_floating_point() else t
                              for t in inputs))


def prep_param_lists(model, flat_master=False):
    """``(model_params, master_params)``: the params of ``model`` that require grad and
    float32 copies of them that require grad, for ``model_grads_to_master_grads`` and
    ``master_params_to_model_params``. With ``flat_master`` the copies are one flat
    float32 Parameter (a list of one) with a zeroed grad; the model's params must then
    share one dtype."""
    model_params = [p for p in model.parameters() if p.requires_grad]
    if not flat_master:
        masters = [p.detach().clone().float().requires_grad_() for p in model_params]
        return model_params, masters
    dtypes = {p.dtype for p in model_params}
    if len(dtypes) > 1:
        raise TypeError(f"prep_param_lists(flat_master=True) needs params of one dtype, the model has "
                        f"{sorted(map(str, dtypes))}: use flat_master=False or FP16_Optimizer")
    flat = nn.Parameter(_flatten_dense_tensors([p.detach() for p in model_params]).float())
    flat.grad = torch.zeros_like(flat)
    return model_params, [flat]


def model_grads_to_master_grads(model_params, master_params, flat_master=False):
    """Copies the model's grads into the masters' (allocating them); a model param with
    no grad leaves its master with none."""
    if flat_master:
        master_params[0].grad.copy_(_flatten_dense_tensors([p.grad for p in model_params]))
        return
    for model, master in zip(model_params, master_params, strict=True):
        if model.grad is None:
            master.grad = None
            continue
        if master.grad is None:
            master.grad = torch.empty_like(master)
        master.grad.copy_(model.grad)


def master_params_to_model_params(model_params, master_params, flat_master=False):
    """Copies the masters' values into the model's params (rounding to their dtype)."""
    if flat_master:
        masters = _unflatten_dense_tensors(master_params[0].detach(), model_params)
    else:
        masters = [m.detach() for m in master_params]
    with torch.no_grad():
        for model, master in zip(model_params, masters, strict=True):
            model.copy_(master)


def zero_grads(params, set_to_none):
    """Drops or zeroes the grads of ``params`` as ``torch.optim.Optimizer.zero_grad``
    does: a grad that is a view (a DDP bucket's) cannot be detached in place."""
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
            continue
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()


def to_python_float(t):
    """``t`` as a Python number (``t.item()``; ``t[0]`` for a sequence)."""
    return t.item() if hasattr(t, "item") else t[0]
