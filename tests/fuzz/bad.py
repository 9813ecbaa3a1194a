"""Bad input: one fault put into a legal call, the kind drawn. Each must be refused
with a clear error (ValueError or TypeError naming the argument), the same on every
route, or, where the fault turns out legal (a float16 tensor put into a float16 list),
computed as the reference computes it."""

import torch

KINDS = ("dtype", "device", "shape", "length", "alias_outputs", "alias_input", "partial_overlap", "sparse",
         "expanded_output", "int_arg", "float_arg")


def _schema_args(name):
    return getattr(torch.ops.core_ops, name).default._schema.arguments


def _slots(name, args):
    """(position, index or None, written) of every tensor in ``args``."""
    out = []
    for position, arg in enumerate(_schema_args(name)):
        written = bool(arg.alias_info and arg.alias_info.is_write)
        value = args[position]
        if isinstance(value, torch.Tensor):
            out.append((position, None, written))
        elif isinstance(value, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in value):
            out += [(position, i, written) for i in range(len(value))]
    return out


def _get(args, slot):
    position, index, _ = slot
    return args[position] if index is None else args[position][index]


def _set(args, slot, value):
    position, index, _ = slot
    if index is None:
        args[position] = value
    else:
        args[position] = list(args[position])
        args[position][index] = value


def mutate(d, name, args):
    """(args with one fault, what it is), or None when this call has no place for the
    drawn kind (an empty call has no tensor to alias)."""
    args = list(args)
    slots = _slots(name, args)
    kind = d.pick(KINDS)
    written = [s for s in slots if s[2] and _get(args, s).numel() > 0]
    if kind == "dtype" and slots:
        s = d.pick(slots)
        dtype = d.pick((torch.int32, torch.int64, torch.float16, torch.float64, torch.bfloat16, torch.uint8, torch.bool))
        _set(args, s, _get(args, s).to(dtype))
        return args, f"{_label(name, s)} as {dtype}"
    if kind == "device" and slots:
        s = d.pick(slots)
        _set(args, s, _get(args, s).to("meta"))
        return args, f"{_label(name, s)} on meta"
    if kind == "shape":
        listed = [s for s in slots if s[1] is not None]
        if listed:
            s = d.pick(listed)
            t = _get(args, s)
            _set(args, s, torch.zeros(t.numel() + 1, dtype=t.dtype))
            return args, f"{_label(name, s)} of {t.numel() + 1} elements"
    if kind == "length":
        lists = [p for p, v in enumerate(args) if isinstance(v, (list, tuple)) and v
                 and all(isinstance(t, torch.Tensor) for t in v)]
        if lists:
            p = d.pick(lists)
            args[p] = list(args[p])[:-1]
            return args, f"{_schema_args(name)[p].name} one tensor short"
    # Aliases of the same shape and dtype: the call's one fault is that they share memory.
    # alias_outputs makes a written tensor another written one; alias_input makes any
    # other tensor of the call a written one.
    if kind in ("alias_outputs", "alias_input") and written:
        a = d.pick(written)
        pool = written if kind == "alias_outputs" else slots
        twins = [s for s in pool if s != a and _alike(_get(args, s), _get(args, a))]
        if twins:
            b = d.pick(twins)
            _set(args, b, _get(args, a))
            return args, f"{_label(name, b)} is {_label(name, a)}"
    if kind == "partial_overlap" and written:
        a = d.pick(written)
        ta = _get(args, a)
        others = [s for s in slots if s != a and _get(args, s).shape == ta.shape and _get(args, s).dtype == ta.dtype]
        if others and ta.numel() > 1:
            b = d.pick(others)
            base = torch.empty(ta.numel() + 1, dtype=ta.dtype)
            va, vb = base[1:].view(ta.shape), base[:-1].view(ta.shape)
            vb.copy_(_get(args, b))
            va.copy_(ta)
            _set(args, a, va)
            _set(args, b, vb)
            return args, f"{_label(name, a)} one element past {_label(name, b)} in one buffer"
    if kind == "sparse":
        listed = [s for s in slots if s[1] is not None and _get(args, s).dim() >= 1]
        if listed:
            s = d.pick(listed)
            _set(args, s, _get(args, s).detach().to_sparse())
            return args, f"{_label(name, s)} sparse"
    if kind == "expanded_output":
        wide = [s for s in written if _get(args, s).numel() > 1]
        if wide:
            s = d.pick(wide)
            t = _get(args, s)
            _set(args, s, torch.zeros((1,) * t.dim(), dtype=t.dtype).expand(t.shape))
            return args, f"{_label(name, s)} expanded from one element"
    if kind == "int_arg":
        # ScalarType arguments show as int in a schema: Python passes them as dtypes.
        ints = [p for p, arg in enumerate(_schema_args(name))
                if arg.type == torch.IntType.get() and "dtype" not in arg.name]
        if ints:
            p = d.pick(ints)
            args[p] = d.pick((-1, 0, 3, 2**40, 2**62))
            return args, f"{_schema_args(name)[p].name}={args[p]}"
    if kind == "float_arg":
        floats = [p for p, arg in enumerate(_schema_args(name)) if arg.type == torch.FloatType.get()]
        if floats:
            p = d.pick(floats)
            args[p] = d.pick((float("nan"), float("inf"), -1.0, 0.0, 1e30))
            return args, f"{_schema_args(name)[p].name}={args[p]}"
    return None


def _alike(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()


def _label(name, slot):
    position, index, _ = slot
    arg = _schema_args(name)[position].name
    return arg if index is None else f"{arg}[{index}]"
