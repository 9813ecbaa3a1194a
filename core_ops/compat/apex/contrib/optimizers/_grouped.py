"""The per-group lists that contrib's optimizers take in ``step(grads=...,
output_params=...)``: one list for a single group, or a list of lists."""

import types


def per_group(values, groups, name):
    """``values`` as one entry per param group (None where not given)."""
    if values is None:
        return [None] * groups
    if isinstance(values, types.GeneratorType):
        values = [list(values)]
    elif len(values) and not isinstance(values[0], (list, tuple)):
        values = [values]
    if len(values) != groups:
        raise ValueError(f"{name}: {len(values)} lists for {groups} param groups")
    return [None if v is None else list(v) for v in values]
