"""FusedAdam's compact state: which layout each param's state takes, making it, and
converting a loaded state of any layout (torch.optim.AdamW's, fp32 FusedAdam's,
bfloat16 or 8-bit moments, fp32 masters or remainders) into the optimizer's own.

The formats themselves are in core_ops/reference/compact_state.py (Note [Master
remainders], Note [Blockwise 8-bit moments]). State keys: ``exp_avg`` /
``exp_avg_sq`` (float32, bfloat16, or uint8 codes with ``exp_avg_absmax`` /
``exp_avg_sq_absmax``), ``master_param`` (float32 master) or ``master_remainder``
(int16, bfloat16 params).
"""

from __future__ import annotations

import torch

from .._sharded import local
from ..reference.compact_state import (BLOCK, MIN_QUANTIZED_NUMEL, blocks_of, dequantize, dynamic_map,
                                       flat, join_master, quantize, split_master)

STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.uint8}
MOMENTS = ("exp_avg", "exp_avg_sq")
COMPACT_KEYS = ("exp_avg_absmax", "exp_avg_sq_absmax", "master_remainder")


def state_dtype_name(state_dtype):
    """"float32", "bfloat16" or "int8" for what a user may pass as ``state_dtype``."""
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", None: "float32"}
    if isinstance(state_dtype, torch.dtype) or state_dtype is None:
        name = names.get(state_dtype)
    else:
        name = str(state_dtype) if str(state_dtype) in STATE_DTYPES else None
    if name is None:
        raise ValueError(f"state_dtype must be torch.float32, torch.bfloat16 or \"int8\" (8-bit blockwise "
                         f"moments), got {state_dtype!r}")
    return name


def check_master_weights(master_weights, supports_remainder, owner):
    if master_weights in (True, False):
        return bool(master_weights)
    if master_weights == "remainder":
        if not supports_remainder:
            raise ValueError(f"{owner}: master_weights=\"remainder\" is for FusedAdam; use master_weights=True")
        return master_weights
    raise ValueError(f"{owner}: master_weights must be True, False or \"remainder\", got {master_weights!r}")


def moment_dtype(state_dtype, p, min_8bit_size=MIN_QUANTIZED_NUMEL):
    """The dtype of ``p``'s moments: float64 params keep float64 state; tensors under
    ``min_8bit_size`` elements keep float32 under "int8"."""
    if p.dtype == torch.float64:
        return torch.float64
    want = STATE_DTYPES[state_dtype]
    if want == torch.uint8 and local(p).numel() < min_8bit_size:
        return torch.float32
    return want


class Maps:
    """The two 256-value maps of 8-bit moments, on each device they are used on."""

    def __init__(self):
        self._on = {}

    def __call__(self, device):
        if device not in self._on:
            self._on[device] = (dynamic_map(signed=True).to(device), dynamic_map(signed=False).to(device))
        return self._on[device]


_ZERO_CODES = {}


def zero_code(signed):
    """The code of 0.0 in a map."""
    if signed not in _ZERO_CODES:
        _ZERO_CODES[signed] = int((dynamic_map(signed) == 0).nonzero())
    return _ZERO_CODES[signed]


def new_moment(p, key, dtype):
    """{key: zeros} (and the zeroed block maxima of 8-bit codes) for moment ``key`` of ``p``."""
    if dtype != torch.uint8:
        return {key: torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)}
    codes = torch.full_like(p, zero_code(key == "exp_avg"), dtype=torch.uint8, memory_format=torch.preserve_format)
    return {key: codes, f"{key}_absmax": new_block_maxima(p)}


def new_moments(p, dtype):
    """Both moments of a fresh param, in ``dtype``."""
    return {k: v for key in MOMENTS for k, v in new_moment(p, key, dtype).items()}


# Note [Block maxima of shards]: under FSDP2 a rank's 8-bit moment covers its shard of
# the param, in blocks over that shard; the shard's block maxima are per rank. They are
# kept as a DTensor laid out over the param's mesh (Shard(0) where the param is
# sharded, Replicate where it is replicated), each rank's part padded to the block count
# of the largest shard, so that the parts are even: torch.distributed.checkpoint then
# saves and loads every rank's own maxima. (A plain tensor would be taken as one value
# replicated on every rank, and every rank would load rank 0's.) A checkpoint resumes
# on the same mesh; on another, the maxima's global size differs and the load says so.

def new_block_maxima(p):
    """Zeroed block maxima for an 8-bit moment of ``p`` (Note [Block maxima of shards])."""
    if not _sharded(p):
        return torch.zeros(blocks_of(p.numel()), dtype=torch.float32, device=p.device)
    from torch.distributed.tensor import DTensor, Replicate, Shard
    shape, parts, placements = list(p.shape), 1, []
    for i, placement in enumerate(p.placements):
        if placement.is_shard():
            shape[placement.dim] = -(-shape[placement.dim] // p.device_mesh.size(i))  # chunk's ceil
            parts *= p.device_mesh.size(i)
            placements.append(Shard(0))
        else:
            placements.append(Replicate())
    most = blocks_of(int(torch.Size(shape).numel()))  # the largest shard's block count
    part = torch.zeros(most, dtype=torch.float32, device=local(p).device)
    return DTensor.from_local(part, p.device_mesh, placements, run_check=False, shape=(most * parts,),
                              stride=(1,))


def block_maxima(absmax, numel):
    """The maxima of this rank's ``numel`` elements: a view of ``absmax`` (a DTensor's
    local part has padding past them)."""
    return local(absmax)[:blocks_of(numel)] if _sharded(absmax) else absmax


def check_saved_maxima(saved, key, n):
    """Raises unless saved 8-bit ``key`` of ``n`` elements has its blocks' maxima."""
    absmax = saved.get(f"{key}_absmax")
    have = -1 if not isinstance(absmax, torch.Tensor) else local(absmax).numel()
    if have != blocks_of(n) and not (_sharded(absmax) and have >= blocks_of(n)):
        got = "none" if have < 0 else f"{have} block maxima"
        raise ValueError(f"state '{key}' holds 8-bit codes of {n} elements, which need {blocks_of(n)} "
                         f"maxima of blocks of {BLOCK} in '{key}_absmax', got {got}: a state dict saved "
                         "with another block size or layout; convert it where it was saved "
                         "(core_ops.optimizers.full_precision_state_dict) and load that")


def moment_values(saved, key, p, maps):
    """A saved moment as float32 laid out as ``p`` (the local tensor), whatever its layout."""
    value = saved[key]
    out = torch.empty_like(local(p), dtype=torch.float32)
    if value.dtype == torch.uint8:
        n = out.numel()
        check_saved_maxima(saved, key, n)
        absmax = saved[f"{key}_absmax"]
        qmap = maps(out.device)[MOMENTS.index(key)]
        flat(out).copy_(dequantize(flat(local(value)).to(out.device), block_maxima(absmax, n).to(out.device), qmap))
    else:
        out.copy_(local(value))
    return out


def store_moment(state, key, values, dtype, p, maps):
    """``state[key]`` (and its maxima) holding float32 ``values`` in ``dtype``."""
    fresh = new_moment(p, key, dtype)
    target = local(fresh[key])
    if dtype == torch.uint8:
        codes, absmax = quantize(flat(values), maps(values.device)[MOMENTS.index(key)])
        flat(target).copy_(codes)
        block_maxima(fresh[f"{key}_absmax"], values.numel()).copy_(absmax)
        state[f"{key}_absmax"] = fresh[f"{key}_absmax"]
    else:
        target.copy_(values)
        state.pop(f"{key}_absmax", None)
    state[key] = fresh[key]


def convert_loaded(state, saved, p, state_dtype, master_weights, maps, min_8bit_size=MIN_QUANTIZED_NUMEL):
    """Puts into ``state`` (torch's loader's result for param ``p``) the saved state in
    this optimizer's layout, exactly where the layouts agree."""
    for key in MOMENTS:
        value = saved.get(key)
        if not isinstance(value, torch.Tensor):
            continue
        dtype = moment_dtype(state_dtype, p, min_8bit_size)
        if value.dtype == dtype:  # the same layout: exactly as saved (decoding and coding again would not be)
            fresh = new_moment(p, key, dtype)
            local(fresh[key]).copy_(local(value))
            state[key] = fresh[key]
            if dtype == torch.uint8:
                n = local(p).numel()
                check_saved_maxima(saved, key, n)
                block_maxima(fresh[f"{key}_absmax"], n).copy_(block_maxima(saved[f"{key}_absmax"], n))
                state[f"{key}_absmax"] = fresh[f"{key}_absmax"]
            else:
                state.pop(f"{key}_absmax", None)
            continue
        store_moment(state, key, moment_values(saved, key, p, maps), dtype, p, maps)
    master = saved.get("master_param")
    remainder = saved.get("master_remainder")
    state.pop("master_param", None)
    state.pop("master_remainder", None)
    if p.dtype not in (torch.float16, torch.bfloat16) or not master_weights:
        return
    half = local(p).detach()
    if isinstance(remainder, torch.Tensor):
        full = join_master(half, local(remainder).to(half.device))
    elif isinstance(master, torch.Tensor):
        full = local(master).to(half.device, torch.float32)
        # An element whose param no longer rounds from the master was written since
        # (Note [Writes to half params]): the param's value wins.
        full = torch.where(full.to(half.dtype) == half, full, half.float())
    else:
        return  # made from the param at the first step
    if master_weights == "remainder":
        state["master_remainder"] = laid_out_as(p, torch.int16, split_master(full)[1])
    else:
        state["master_param"] = laid_out_as(p, torch.float32, full)


def _sharded(p):
    return local(p) is not p


def laid_out_as(p, dtype, values):
    """A ``dtype`` tensor laid out (and sharded) as ``p``, holding ``values`` (``p``'s local part's)."""
    out = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
    local(out).copy_(values)
    return out


def initial_remainders(p):
    """The int16 remainders of a float32 param about to be cast to bfloat16, laid out
    (and sharded) as ``p``."""
    return laid_out_as(p, torch.int16, split_master(local(p).detach())[1])


def full_precision_state_dict(state_dict):
    """A copy of a FusedAdam state dict with float32 moments and no compact keys, for
    torch.optim.Adam / AdamW or any optimizer that knows only float32 state (8-bit
    moments dequantized, bfloat16 ones widened). fp32 masters are kept; remainders,
    which need the param to mean anything, are dropped (the param is the master
    rounded: load the state dict into a FusedAdam to keep them)."""
    maps = Maps()
    out = {"state": {}, "param_groups": [dict(g) for g in state_dict["param_groups"]]}
    for pid, saved in state_dict["state"].items():
        entry = {k: v for k, v in saved.items() if k not in COMPACT_KEYS}
        for key in MOMENTS:
            value = saved.get(key)
            if isinstance(value, torch.Tensor) and value.dtype == torch.uint8:
                values = torch.empty(value.shape, dtype=torch.float32, device=value.device)
                values = values.as_strided(value.shape, value.stride())
                entry[key] = moment_values(saved, key, values, maps)
            elif isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
                entry[key] = value.float()
        out["state"][pid] = entry
    return out
