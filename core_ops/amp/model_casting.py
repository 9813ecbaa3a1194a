"""What ``initialize`` does to a model: cast its weights (keeping batchnorm in float32
when asked), cast inputs and outputs around its forward, run O1's forward under
``torch.autocast``, and keep ``state_dict`` float32 (O2: the master weights' values,
so a checkpoint is exact; an fp32 checkpoint loads back into the masters exactly).

The forward is replaced by an instance attribute bound to the model, like Apex's; it
calls the class's forward, so ``copy.deepcopy`` of an initialized model works.
"""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm


def cast_tree(value, dtype):
    """Floating tensors in ``value`` (nested lists, tuples, dicts) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        cast = [cast_tree(v, dtype) for v in value]
        return type(value)(*cast) if hasattr(value, "_fields") else type(value)(cast)
    if isinstance(value, dict):
        return type(value)((k, cast_tree(v, dtype)) for k, v in value.items())
    return value


def module_device_type(model):
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device.type
    return "cpu"


def cast_module_tensors(model, dtype, keep_batchnorm_fp32):
    """Casts floating params and buffers to ``dtype`` in place (the Parameter objects
    stay, so references held elsewhere see the cast). Returns the cast params."""
    cast = []
    for module in model.modules():
        if keep_batchnorm_fp32 and isinstance(module, _BatchNorm):
            continue  # mixed-dtype batch_norm takes half input with float32 weights
        for p in module.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
                p.grad = None
                cast.append(p)
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.is_floating_point():
                setattr(module, name, b.to(dtype))
        if isinstance(module, torch.nn.RNNBase):
            module.flatten_parameters()
    return cast


def patch_forward(model, input_dtype, output_dtype, autocast_dtype):
    """``model.forward`` with inputs cast to ``input_dtype``, the body under
    ``torch.autocast(autocast_dtype)`` and outputs cast to ``output_dtype`` (each
    optional)."""
    device_type = module_device_type(model)

    def forward(self, *args, **kwargs):
        if input_dtype is not None:
            args, kwargs = cast_tree(args, input_dtype), cast_tree(kwargs, input_dtype)
        if autocast_dtype is not None:
            with torch.autocast(device_type, dtype=autocast_dtype):
                out = type(self).forward(self, *args, **kwargs)
        else:
            out = type(self).forward(self, *args, **kwargs)
        return out if output_dtype is None else cast_tree(out, output_dtype)

    model.forward = forward.__get__(model)


def keep_state_dict_fp32(model, masters):
    """``model.state_dict()`` holds float32 values: the master of a param that has
    one, else the half tensor upcast. Loading copies float32 values into the masters
    as well, exactly (the half params receive their rounding, as ever)."""
    names = {id(p): n for n, p in model.named_parameters()}
    by_name = {names[id(p)]: m for p, m in masters.items() if id(p) in names}

    def save_hook(module, state_dict, prefix, local_metadata):
        for key, value in list(state_dict.items()):
            if not key.startswith(prefix):
                continue
            master = by_name.get(key[len(prefix):])
            if master is not None:
                state_dict[key] = master.detach()
            elif isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
                state_dict[key] = value.float()
        return state_dict

    def load_hook(module, state_dict, prefix, *args):
        for name, master in by_name.items():
            value = state_dict.get(prefix + name)
            if isinstance(value, torch.Tensor) and value.shape == master.shape:
                with torch.no_grad():
                    master.copy_(value)

    model._register_state_dict_hook(save_hook)
    model._register_load_state_dict_pre_hook(load_hook, with_module=True)
