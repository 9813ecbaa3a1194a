"""Note [Op boundary]: what every multi-tensor and optimizer op checks of any call,
whichever kernel runs it, read off the op's schema in _schemas.py:

- one device: every tensor of the call is on the device of its first tensor (the first
  of its first list). A tensor elsewhere is an error, not a no-op: dispatch picks the
  kernel by the devices of all arguments, so a lone ``meta`` flag among CPU tensors
  sends the call to the fake kernel, which must refuse it as the CPU kernel would;
- Note [Aliasing] (_aliasing.py): a tensor the schema marks written (``Tensor(a!)``)
  shares memory with no other, but its in-place partner (``IN_PLACE``);
- under grad mode, no written tensor requires grad: the ops write in place and record
  nothing for autograd, so a leaf would be changed behind its graph's back and a
  non-leaf's grads would come out wrong (torch's in-place and foreach ops refuse a leaf
  alike). Optimizers step under ``torch.no_grad()``. The native kernels cannot see
  requires_grad through torch's stable ABI, so a raw ``torch.ops.core_ops`` call that
  reaches one is not checked; every public function is (``check_no_grad_writes``);
- a ``grad_scale`` held on the host (a CPU tensor) is finite and > 0 unless the step is
  skipped (``found_inf`` set): grads divided by 0 or nan would turn the params into nan. On a GPU the kernels read it on the device,
  where checking it would cost a host sync each step, so it is not checked there.

The native kernels make both checks in C++ with the same words (``CallDevice`` in
csrc/include/core_ops/tensor_lists.h, ``Operands`` in aliasing.h); the reference and fake
kernels are wrapped by ``checked`` here when they are registered.
"""

import functools
import math

import torch

from . import _op_checks
from ._aliasing import check_operands
from ._validate import check_flag

# op -> {read list: the written list whose i-th tensor may be the read list's i-th itself}
IN_PLACE = {
    "multi_tensor_scale_": {"src": "dst"},
    "multi_tensor_axpby_": {"x": "out", "y": "out"},
}


@functools.lru_cache(maxsize=None)
def _tensor_args(name):
    """(position, argument name, is a list, written) of each tensor argument of ``name``."""
    schema = getattr(torch.ops.core_ops, name).default._schema
    out = []
    for position, arg in enumerate(schema.arguments):
        kind = arg.type
        if isinstance(kind, torch.OptionalType):
            kind = kind.getElementType()
        is_list = isinstance(kind, torch.ListType)
        if (kind.getElementType() if is_list else kind) != torch.TensorType.get():
            continue
        out.append((position, arg.name, is_list, bool(arg.alias_info and arg.alias_info.is_write)))
    return tuple(out)


def _values(name, args, kwargs):
    for position, arg, is_list, written in _tensor_args(name):
        value = args[position] if position < len(args) else kwargs.get(arg)
        yield arg, value, is_list, written


def check_one_device(named):
    """``named``: (name, tensor or list or None) in the op's argument order."""
    device = None
    for arg, value, is_list in named:
        if value is None:
            continue
        items = enumerate(value) if is_list else [(None, value)]
        for index, t in items:
            if device is None:
                device = t.device
            elif t.device != device:
                label = arg if index is None else f"{arg}[{index}]"
                raise ValueError(f"{label} is on {t.device} but the op runs on {device}")


def check_call(name, args, kwargs):
    values = list(_values(name, args, kwargs))
    if not all(isinstance(v, torch.Tensor) if not is_list else isinstance(v, (list, tuple))
               for _, v, is_list, _ in values if v is not None):
        return  # the kernel's own checks name what is not a tensor
    check_one_device([(arg, v, is_list) for arg, v, is_list, _ in values])
    partners = IN_PLACE.get(name, {})
    check_operands(reads=[(arg, v, partners.get(arg)) for arg, v, _, written in values if not written],
                   writes=[(arg, v) for arg, v, _, written in values if written])
    check_no_grad_writes(name, [(arg, v) for arg, v, _, written in values if written])
    lists = [v for _, v, is_list, _ in values if is_list]
    if name != "update_scale_" and lists and len(lists[0]):  # an empty call reads none of them
        check_lone_tensors({arg: v for arg, v, _, _ in values if v is not None})


# The lone tensors of the list ops, in the native kernels' words (tensor_lists.h,
# optimizer_args.h, the CPU read_scalar and the CUDA device_scalar); update_scale_'s
# kernels check its own (_validate.check_update_scale_tensors).
_ONE_ELEMENT = {"scale": "scale must be a one-element tensor, got shape {shape}",
                "inv_scale": "inv_scale must be a one-element tensor, got shape {shape}",
                "lr_tensor": "lr must be a one-element tensor on {device}",
                "grad_scale": "grad_scale must be a one-element tensor on {device}"}


def check_lone_tensors(given):
    device = next(t.device for v in given.values() for t in ([v] if isinstance(v, torch.Tensor) else v))
    if "found_inf" in given:
        check_flag(given["found_inf"])
    for arg, words in _ONE_ELEMENT.items():
        t = given.get(arg)
        if t is not None and t.numel() != 1:
            raise ValueError(words.format(shape=list(t.shape), device=device))
        if t is not None and not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
            name = "lr" if arg == "lr_tensor" else arg
            raise TypeError(f"{name} must be a floating or integer tensor, got {t.dtype}")
    if "grad_scale" in given:
        check_grad_scale(given["grad_scale"], given.get("found_inf"))


def check_no_grad_writes(op_name, written):
    """``written``: (name, tensor or list or None) an op writes in place."""
    if not torch.is_grad_enabled():
        return
    for arg, value in written:
        items = [(None, value)] if isinstance(value, torch.Tensor) else enumerate(value or ())
        for index, t in items:
            if t.requires_grad:
                label = arg if index is None else f"{arg}[{index}]"
                raise RuntimeError(f"{label} requires grad, and {op_name} writes it in place, which autograd "
                                   "cannot record: call it under torch.no_grad() (as optimizers step) or pass "
                                   ".detach() of it")


def check_grad_scale(grad_scale, found_inf):
    """A step skipped by its flag reads no grads: its scale may be anything (FusedLAMB
    folds the clip of an infinite norm into it)."""
    if grad_scale.device.type != "cpu" or isinstance(grad_scale, torch._subclasses.FakeTensor):
        return
    if found_inf is not None and found_inf.numel() == 1 and found_inf.item() > 0:
        return
    value = grad_scale.reshape(-1)[0].item() if grad_scale.numel() == 1 else None
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"grad_scale must be finite and > 0, got {value:g}")


def checked(name, fn):
    """``fn`` (a reference or fake kernel of op ``name``) behind the boundary's checks,
    then the op's declared ones (Note [Declared checks] in _op_checks.py)."""
    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        check_call(name, args, kwargs)
        declared = _op_checks.CHECKS.get(name)
        if declared:
            values = dict(zip((a.name for a in declared[0]), args))
            values.update(kwargs)
            _op_checks.run(name, values)
        return fn(*args, **kwargs)
    return kernel


def has_boundary(name):
    """Whether op ``name`` takes tensor lists or writes a tensor it is given: the ops
    this module checks (the norm and batch-norm ops make new outputs, and check their
    devices themselves)."""
    return any(is_list or written for _, _, is_list, written in _tensor_args(name))
