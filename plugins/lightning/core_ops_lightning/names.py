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


def is_ours(precision):
    return isinstance(precision, str) and precision.startswith(PREFIX)


def parse(name):
    """(opt level, half dtype) of a precision name; an error naming the valid ones."""
    if name not in NAMES:
        raise ValueError(f"unknown precision {name!r}; core_ops_lightning's are "
                         f"{', '.join(NAMES)} (or plugins=[ApexPrecision(opt_level, half_dtype=...)])")
    return NAMES[name]


def near_miss(precision):
    """The name of ours that ``precision`` misspells (``"apex_O2_bf16"``, ``"O2-bf16"``,
    ``"APEX-o2"``), or None: Lightning's own error would list only its names."""
    if not isinstance(precision, str):
        return None
    key = precision.strip().lower().replace("_", "-").replace(" ", "-")
    key = key if key.startswith(PREFIX) else PREFIX + key
    return next((name for name in NAMES if name.lower() == key), None)


def name_of(opt_level, half_dtype):
    """The name that Lightning's ``trainer.precision`` reports for a level and dtype."""
    if opt_level == "O0":
        return "apex-O0"
    return f"apex-{opt_level}" + ("-bf16" if half_dtype == torch.bfloat16 else "")
