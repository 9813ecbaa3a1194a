"""What ``initialize`` does to a model: cast its weights (keeping batchnorm in float32
when asked), cast inputs and outputs around its forward, run O1's forward under
``torch.autocast``, and keep ``state_dict`` float32 (O2: the master weights' values,
so a checkpoint is exact; an fp32 checkpoint loads back into the masters exactly).

The forward is replaced by an instance attribute bound to the model, like Apex's; it
calls the class's forward, so ``copy.deepcopy`` of an initialized model works.
"""

from __future__ import annotations

import collections.abc
import copy
import types

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from . import masters


def floating_tensors(value):
    """The floating tensors in ``value`` (nested lists, tuples, dicts), in order."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from floating_tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from floating_tensors(v)


def cast_tree(value, dtype, batch_objects=False):
    """Floating tensors in ``value`` (nested lists, tuples, mappings) cast to ``dtype``.
    With ``batch_objects`` (a model's inputs, as Apex's input caster did), other objects
    with a ``to`` method (custom batch classes) get ``.to(dtype)``."""
    def cast(v):
        return cast_tree(v, dtype, batch_objects)

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        items = [cast(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if type(value) is dict:  # a forward's kwargs: a new dict (torch.compile traces it; copy.copy it does not)
        return {k: cast(v) for k, v in value.items()}
    if isinstance(value, dict):
        # A shallow copy keeps the mapping's type and its extras (a defaultdict's
        # factory, which ``type(value)(pairs)`` would have taken the pairs for).
        out = copy.copy(value)
        for k, v in value.items():
            out[k] = cast(v)
        return out
    if isinstance(value, collections.abc.Mapping):  # UserDict, HF's BatchEncoding, ...
        items = {k: cast(v) for k, v in value.items()}
        try:
            return type(value)(items)  # never the caller's mapping, changed in place
        except TypeError:
            return items
    if batch_objects and callable(getattr(value, "to", None)) and not isinstance(
            value, (str, torch.nn.Module)):
        try:
            return value.to(dtype)
        except TypeError:  # a to() that takes devices only (graph batches): left as it is
            return value
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


def patch_forward(model, input_dtype, output_dtype, autocast_dtype, handle=None, has_masters=False):
    """``model.forward`` with inputs cast to ``input_dtype``, the body under
    ``torch.autocast(autocast_dtype)`` while ``handle`` is active (O1's
    ``_amp_state.handle``) and outputs cast to ``output_dtype`` (each optional).
    ``has_masters``: the forward refuses to run once FSDP2 has sharded the model
    (``fully_shard`` changes its class), which would leave the masters of the params it
    replaced without grads, training nothing."""
    device_type = module_device_type(model)
    cls = type(model)

    def forward(self, *args, **kwargs):
        if has_masters and type(self) is not cls and type(self).__name__.startswith("FSDP"):
            raise RuntimeError("this model was sharded by fully_shard after amp.initialize / AmpLoop made "
                               "its fp32 masters, which the sharded params no longer reach: shard first "
                               "(fully_shard), then call amp.initialize on the sharded model (its float32 "
                               "shards are then the masters)")
        if input_dtype is not None:
            args = cast_tree(args, input_dtype, batch_objects=True)
            kwargs = cast_tree(kwargs, input_dtype, batch_objects=True)
        if autocast_dtype is not None and (handle is None or handle.is_active()):
            with torch.autocast(device_type, dtype=autocast_dtype):
                out = type(self).forward(self, *args, **kwargs)
        else:
            out = type(self).forward(self, *args, **kwargs)
        return out if output_dtype is None else cast_tree(out, output_dtype)

    model.forward = forward.__get__(model)


class CastInputs:
    """A forward pre-hook: the floating tensors among a module's arguments (nested
    containers too) arrive in ``dtype``. A class, so that a model holding it pickles."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, module, args, kwargs):
        # The common call, tensors already in dtype (from the half layer before): nothing
        # to cast and nothing rebuilt (None leaves the arguments as they are); this runs
        # for every half module on every forward.
        if not kwargs and all(type(a) is torch.Tensor and (a.dtype == self.dtype or not a.is_floating_point())
                              for a in args):
            return None
        return cast_tree(args, self.dtype), cast_tree(kwargs, self.dtype)


def cast_inputs_of_half_modules(model, dtype):
    """Every module of ``model`` that holds ``dtype`` params itself casts its floating
    inputs to ``dtype`` (a hook each): a half layer takes float32 tensors from wherever
    they come (a submodule called directly, noise made in a training step, another
    model's float32 outputs) and nothing else is cast (targets, masks computed outside
    the half layers). BatchNorm kept float32 takes half inputs as they are."""
    for module in model.modules():
        if any(p.dtype == dtype for p in module.parameters(recurse=False)):
            module.register_forward_pre_hook(CastInputs(dtype), with_kwargs=True)


def _own_and_unhooked(module, prefix):
    """``(prefix, module)`` for ``module`` and its descendants that have no hooks of
    their own (modules attached after ``initialize``): each hook covers those, and a
    hooked descendant covers itself, so every param is handled once per call."""
    yield prefix, module
    for name, child in module.named_children():
        if not getattr(child, "_core_ops_amp_hooked", False):
            yield from _own_and_unhooked(child, f"{prefix}{name}.")


def _save_fp32(module, state_dict, prefix, local_metadata):
    # Every name of a param (tied ones included) gets its master (Note [Master registry]).
    registry = masters.of(module)
    for sub_prefix, sub in _own_and_unhooked(module, prefix):
        for name, value in (*sub._parameters.items(), *sub._buffers.items()):
            key = sub_prefix + name
            if isinstance(state_dict.get(key), torch.Tensor) and state_dict[key].dtype in masters.HALF:
                state_dict[key] = state_dict[key].float()
            master = registry.get(value) if isinstance(value, torch.nn.Parameter) else None
            if master is not None and key in state_dict:
                state_dict[key] = masters.merged(value, master)  # Note [Writes to O2 half params]
    return state_dict


def _load_fp32(module, state_dict, prefix, *args):
    # Runs on every module hooked at initialize, so loading into a submodule reaches
    # the masters too, exactly.
    registry = masters.of(module)
    for sub_prefix, sub in _own_and_unhooked(module, prefix):
        for name, p in sub._parameters.items():
            master, value = registry.get(p), state_dict.get(sub_prefix + name)
            if master is not None and isinstance(value, torch.Tensor) and value.shape == master.shape:
                with torch.no_grad():
                    master.copy_(value)


def _zero_grad_with_masters(self, set_to_none=True):
    type(self).zero_grad(self, set_to_none=set_to_none)
    registry = masters.of(self)
    for p in self.parameters():
        m = registry.get(p)
        if m is not None and m.grad is not None:
            if set_to_none:
                m.grad = None
            else:
                m.grad.zero_()


def keep_state_dict_fp32(model, registry):
    """``model.state_dict()`` holds float32 values: the master of a param that has
    one, else the half tensor upcast. Loading copies float32 values into the masters
    as well, exactly (the half params receive their rounding, as ever); and
    ``model.zero_grad()`` clears the masters' grads too, or they would accumulate.

    The hooks are module-level functions that find the masters through the module
    they are called on, so a deepcopy's hooks serve the copy (Note [Master registry])."""
    for module in model.modules():  # a submodule's own state_dict / load_state_dict too
        module._core_ops_amp_masters = registry
        module._core_ops_amp_hooked = True
        module._register_state_dict_hook(_save_fp32)
        module._register_load_state_dict_pre_hook(_load_fp32, with_module=True)
    if len(registry):
        model.zero_grad = types.MethodType(_zero_grad_with_masters, model)
