"""Note [Declared checks]: an op's argument checks, declared once beside its schema in
_schemas.py (``declare(schema, *checks)``), in a small vocabulary each of whose words
has its two renderings side by side here:

- ``python(values)`` runs it for the reference and fake kernels (``run``, called by
  ``_boundary.checked`` after the boundary's own checks);
- ``cpp(arguments)`` writes it as C++ for the native kernels' entry point, which
  ``native/entries.py`` generates from the declarations into
  csrc/include/core_ops/optimizer_ops.h (the struct of the op's arguments, the
  boundary's ``CallDevice`` and ``Operands``, these checks, then the device's step).

So an op's checks are listed once, in one order, for every route. The words call
shared check functions that exist in both languages with the same messages
(``_validate.py`` and optimizer_args.h / compact_state_args.h): C++ for the native
kernels, where a Python loop over thousands of tensors would cost more than the op;
Python for the reference and fake kernels, which run where no C++ library loads. The
fuzzer (tests/fuzz) holds the two to the same refusals.
"""

import dataclasses
import re

from . import _validate

CHECKS = {}  # op name -> (its arguments, its declared checks in order)


@dataclasses.dataclass(frozen=True)
class Argument:
    name: str
    kind: str  # as the schema writes it, less alias marks: Tensor[], Tensor, Tensor?, float, int, bool
    written: bool  # Tensor(a!)


def arguments(schema):
    """The arguments of an op ``schema`` string."""
    inside = schema[schema.index("(") + 1:schema.rindex(") ->")]
    out = []
    for part in filter(None, (p.strip() for p in inside.split(","))):
        kind, name = part.split("=")[0].split()
        out.append(Argument(name, re.sub(r"\([a-z]!?\)", "", kind), "!" in kind))
    return tuple(out)


def declare(schema, *checks):
    """``schema``, recording ``checks`` as its op's (returns the schema for SCHEMAS)."""
    CHECKS[schema[:schema.index("(")]] = (arguments(schema), checks)
    return schema


def run(name, values):
    """Op ``name``'s declared checks on ``values`` (argument name -> value)."""
    args, checks = CHECKS.get(name, ((), ()))
    for check in checks:
        if check.python(values, args) is False:
            return  # nothing to do (empty lists): the later checks need tensors


# ---- the vocabulary ----------------------------------------------------------------

_SHARED = ("params", "grads", "steps", "master_params")


def _interpolated(message):
    """A message with ``{arg}`` fields as C++ stream pieces: ``"a ", arg, " b"``."""
    pieces = []
    for k, piece in enumerate(re.split(r"\{(\w+)\}", message)):
        if k % 2:
            pieces.append(piece)
        elif piece:
            pieces.append('"' + piece.replace('"', '\\"') + '"')
    return ", ".join(pieces)


@dataclasses.dataclass(frozen=True)
class OptimizerLists:
    """A fused optimizer's lists (Note [Fused optimizer ops]): params and grads one
    (device, dtype) group with one float32 step count each (where the op has
    ``steps``; without ``grads`` the params stand in), the lone tensors one element,
    every other tensor list (``states``, in schema order, but those ``apart``) one
    state-dtype tensor per param laid out as it, master_params where given. A list in
    ``when`` may be empty unless its flag argument is set (Adam's ``max_exp_avg_sqs``
    without ``amsgrad``), and is checked whenever given. ``master_grads``: where
    master_params are given, the grads may also be float32, the masters' own (Note
    [Master grads] in optimizer_args.h)."""
    when: tuple = ()  # (list, flag argument) pairs
    apart: tuple = ()  # lists a Call checks instead
    master_grads: bool = False

    def states(self, arguments):
        return [a.name for a in arguments
                if a.kind == "Tensor[]" and a.name not in _SHARED and a.name not in self.apart]

    def python(self, values, arguments):
        flags = dict(self.when)
        states = {}
        for name in self.states(arguments):
            given = values[name]
            optional = name in flags and not values[flags[name]]
            states[name] = None if optional and not given else given
        states["master_params"] = values["master_params"] or None
        params = values["params"]
        _validate.check_optimizer_lists(params, values.get("grads", params), values.get("steps"),
                                        master_grads=self.master_grads, **states)
        return bool(params)

    def cpp(self, arguments):
        names = {a.name for a in arguments}
        has = lambda n: n if n in names else "std::nullopt"  # noqa: E731
        grads = "grads" if "grads" in names else "params"
        steps, has_steps = ("steps", "true") if "steps" in names else ("{}", "false")
        flags = dict(self.when)
        master_grads = "true, !master_params.empty()" if self.master_grads else "false, false"
        lines = [f"if (!check_optimizer_group(params, {grads}, {steps}, {has('lr_tensor')}, {has('grad_scale')}, "
                 f"{has('found_inf')}, {has_steps}, {master_grads})) return;"]
        states = self.states(arguments)
        for name in states:
            optional = f"!static_cast<bool>({flags[name]})" if name in flags else "false"
            lines.append(f'check_state_list(params, {name}, "{name}", {optional});')
        lines.append("check_masters(params, master_params);")
        pairs = ", ".join(f'{{{n}, "{n}"}}' for n in states + ["master_params"])
        lines.append(f"check_layouts(params, {{{pairs}}});")
        return lines


@dataclasses.dataclass(frozen=True)
class OneOf:
    """Integer argument ``arg`` is one of ``values`` (checked before the lists, for an
    empty call too)."""
    arg: str
    values: tuple
    message: str

    def python(self, values, arguments):
        if values[self.arg] not in self.values:
            raise ValueError(self.message.format(**{self.arg: values[self.arg]}))

    def cpp(self, arguments):
        test = " || ".join(f"{self.arg} == {v}" for v in self.values)
        return [f"CORE_OPS_CHECK_VALUE({test}, {_interpolated(self.message)});"]


@dataclasses.dataclass(frozen=True)
class Requires:
    """Flag ``arg`` set needs ``needed`` set (nonzero)."""
    arg: str
    needed: str
    message: str

    def python(self, values, arguments):
        if values[self.arg] and not values[self.needed]:
            raise ValueError(self.message)

    def cpp(self, arguments):
        return [f"CORE_OPS_CHECK_VALUE(!{self.arg} || static_cast<bool>({self.needed}), "
                f"{_interpolated(self.message)});"]


@dataclasses.dataclass(frozen=True)
class Call:
    """A shared check function of that name in both languages (_validate.py, and the
    C++ headers optimizer_ops.h includes), given these arguments: in this order in
    C++, by name in Python. ``into`` (a C++ type, a field): the C++ function returns
    an optional of that type, stored in the op's argument struct; none means nothing
    to do (empty lists)."""
    function: str
    args: tuple
    into: tuple = ()

    def python(self, values, arguments):
        getattr(_validate, self.function)(**{a: values[a] for a in self.args})
        return bool(values["params"])

    def cpp(self, arguments):
        call = f"{self.function}({', '.join(self.args)})"
        if self.into:
            return [f"const auto {self.into[1]} = {call};", f"if (!{self.into[1]}.has_value()) return;"]
        return [call + ";"]
