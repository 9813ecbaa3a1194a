"""The precision names the plugin adds to Lightning: ``apex-O0`` ... ``apex-O3`` (fp16,
as Apex) and ``apex-O1-bf16`` ... ``apex-O3-bf16``. O0 computes in float32, so it has
no bf16 twin."""

import torch

PREFIX = "apex-"
NAMES = {
    "apex-O0": ("O0", torch.float16),
    "apex-O1": ("O1", torch.float16),
    "apex-O2": ("O2", torch.float16),
    "apex-O3": ("O3", torch.float16),
    "apex-O1-bf16": ("O1", torch.bfloat16),
    "apex-O2-bf16": ("O2", torch.bfloat16),
    "apex-O3-bf16": ("O3", torch.bfloat16),
}


STRATEGIES = ("apex-ddp", "apex-ddp_spawn", "apex-fsdp")


def is_ours(precision):
    return isinstance(precision, str) and precision.startswith(PREFIX)


def _key(text):
    """A name folded for comparison: case, ``_`` / space for ``-``, the ``apex-`` prefix
    and fp16's explicit suffix (fp16 is the unsuffixed names' dtype) do not matter."""
    key = text.strip().lower().replace("_", "-").replace(" ", "-")
    key = key if key.startswith(PREFIX) else PREFIX + key
    for fp16 in ("-fp16", "-float16", "-half"):
        key = key.removesuffix(fp16)
    return key.replace("-bfloat16", "-bf16")


def parse(name):
    """(opt level, half dtype) of a precision name; an error naming the closest and
    every valid one."""
    if name not in NAMES:
        close = near_miss(name)
        hint = f"did you mean {close!r}? " if close else ""
        raise ValueError(f"unknown precision {name!r}; {hint}core_ops_lightning's are "
                         f"{', '.join(NAMES)} (or plugins=[ApexPrecision(opt_level, half_dtype=...)])")
    return NAMES[name]


def _closest(text, names, cutoff):
    if not isinstance(text, str):
        return None
    import difflib
    folded = {_key(n): n for n in names}
    if _key(text) in folded:
        return folded[_key(text)]
    close = difflib.get_close_matches(_key(text), list(folded), n=1, cutoff=cutoff)
    return folded[close[0]] if close else None


def near_miss(precision):
    """The name of ours that ``precision`` misspells (``"apex_O2_bf16"``, ``"O2-bf16"``,
    ``"apex-o2"``, ``"apex-O2-fp16"``), or None: Lightning's own error would list only
    its names. Lightning's own names (``"bf16-mixed"``) are no miss of ours."""
    if precision in NAMES or not isinstance(precision, str):
        return None
    folded = _key(precision)
    if not (is_ours(precision) or folded.removeprefix(PREFIX)[:1] == "o"):
        return None
    return _closest(precision, NAMES, cutoff=0.9)  # apex-O7 is no apex-O3


def strategy_near_miss(strategy, registered=()):
    """The strategy of ours that ``strategy`` misspells (``"apex-dpp"``, ``"apex_ddp"``,
    ``"APEX-FSDP"``), or None for a registered name or one not close to ours."""
    if not isinstance(strategy, str) or strategy in registered or strategy in STRATEGIES:
        return None
    if "apex" not in strategy.lower() and _key(strategy) not in {_key(n) for n in STRATEGIES}:
        return None
    return _closest(strategy, STRATEGIES, cutoff=0.75)


def name_of(opt_level, half_dtype):
    """The name that Lightning's ``trainer.precision`` reports for a level and dtype."""
    if opt_level == "O0":
        return "apex-O0"
    return f"apex-{opt_level}" + ("-bf16" if half_dtype == torch.bfloat16 else "")
