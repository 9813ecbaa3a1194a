"""FusedAdam: Apex's constructor, torch.optim.Adam / AdamW numerics, one fused kernel
call per (device, dtype) group."""

import warnings

import torch

from .._schemas import op
from ._base import FusedOptimizer, _write_marks_of
from .._sharded import elementwise, local
from . import compact_state


class FusedAdam(FusedOptimizer):
    """Adam (``adam_w_mode=False``: L2 in the gradient) or AdamW (default: decoupled
    weight decay), as ``apex.optimizers.FusedAdam``, on CPU and CUDA.

    Beyond Apex: ``amsgrad=True`` works; ``master_weights=True`` keeps fp32 master
    copies of fp16/bf16 params on any device and saves them in the state dict;
    ``maximize``; ``step(grad_scale=, found_inf=, max_grad_norm=)`` unscales, skips on
    overflow and clips by global norm inside the update (see ``FusedOptimizer``);
    state dicts load into and from ``torch.optim.Adam`` / ``AdamW``.

    Half the memory (docs/optimizers.md, "Compact optimizer state"): ``state_dtype``
    keeps the moments in ``torch.bfloat16`` or ``"int8"`` (8-bit blockwise, Dettmers
    et al.; tensors under ``min_8bit_size`` elements keep float32); ``master_weights="remainder"``
    keeps each bfloat16 param's fp32 master as the param plus an int16 remainder (2
    bytes, not 4; float32 params among them are their own masters). A state dict of
    any of these layouts, or torch's, loads into any other.
    """

    _state_keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    _supports_remainder = True
    _pickled_attrs = (*FusedOptimizer._pickled_attrs, "state_dtype", "min_8bit_size")
    # What an optimizer pickled before these options existed unpickles with.
    state_dtype, min_8bit_size = "float32", 4096

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True,
                 capturable=False, master_weights=False, maximize=False, state_dtype=torch.float32,
                 min_8bit_size=4096, skip_nonfinite=False):
        self.state_dtype = compact_state.state_dtype_name(state_dtype)
        if not (isinstance(min_8bit_size, int) and min_8bit_size >= 0):
            raise ValueError(f"min_8bit_size must be an int >= 0 (elements), got {min_8bit_size!r}")
        self.min_8bit_size = min_8bit_size
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=adam_w_mode, amsgrad=amsgrad,
                        maximize=maximize)
        super().__init__(params, defaults, set_grad_none=set_grad_none,
                         master_weights=master_weights, capturable=capturable,
                         skip_nonfinite=skip_nonfinite)

    def _complete_group(self, group):
        # A torch.optim.Adam / AdamW state dict says which it was (one saved by torch 2.6
        # or older does not: the group keeps this optimizer's mode, and with weight decay
        # that is said), and torch always corrects the bias.
        if "decoupled_weight_decay" in group:
            group.setdefault("adam_w_mode", group["decoupled_weight_decay"])
        elif "adam_w_mode" not in group and group.get("weight_decay"):
            warnings.warn("a loaded param group says neither adam_w_mode nor decoupled_weight_decay (torch's Adam "
                          "and AdamW wrote neither before 2.7), so it is not known whether its weight decay was "
                          f"decoupled: it keeps this FusedAdam's adam_w_mode={self.defaults['adam_w_mode']}. "
                          "Build FusedAdam with the mode of the optimizer that saved it, or set "
                          "param_groups[i]['adam_w_mode'] after loading", stacklevel=4)
        group.setdefault("bias_correction", True)

    def state_dict(self):
        sd = super().state_dict()
        for group in sd["param_groups"]:
            group["decoupled_weight_decay"] = group["adam_w_mode"]  # for torch.optim to load
        return sd

    @property
    def compact(self):
        """Whether the state takes the compact op (compact moments or remainders)."""
        return self.state_dtype != "float32" or self.master_weights == "remainder"

    def _work(self):
        """The base's, after the compact state's own checks (before any update)."""
        work = super()._work()
        for group, _ in work:
            if group["amsgrad"] and self.compact:  # turned on after construction
                self._check_group(group, "")
        if self.master_weights == "remainder":
            dtypes = {dtype for _, buckets in work for (_, dtype) in buckets}
            for group, buckets in work:
                for (_, dtype), ps in buckets.items():
                    if dtype == torch.float16:
                        where = self._param_name(group, next(i for i, q in enumerate(group["params"]) if q is ps[0]),
                                                 ps[0])
                        raise TypeError(f"{where}: master_weights=\"remainder\" keeps the lower 16 bits of a float32 "
                                        "master beside a bfloat16 param; a float16 param is not the upper half of a "
                                        "float32. Use master_weights=True for float16 params")
            if dtypes and torch.bfloat16 not in dtypes:
                raise TypeError(f"master_weights=\"remainder\" keeps fp32 masters as bfloat16 params plus int16 "
                                f"remainders, and every param with a grad here is {sorted(map(str, dtypes))}: cast "
                                "the model to bfloat16 first (amp.initialize(..., opt_level=\"O2\", "
                                "half_dtype=torch.bfloat16)), or use master_weights=False for float32 params")
        return work

    def _check_group(self, group, where):
        super()._check_group(group, where)
        if group["amsgrad"] and self.compact:
            raise ValueError(f"{where}amsgrad=True keeps a third moment that compact state does not "
                             f"hold: use state_dtype=torch.float32 and master_weights=True or False "
                             f"(got state_dtype={self.state_dtype!r}, master_weights={self.master_weights!r})")

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        beta1, beta2 = group["betas"]
        lr, lr_tensor = self._lr(group, device)
        if self.compact and ps[0].dtype != torch.float64:
            return self._step_compact(group, ps, device, lr, lr_tensor, grad_scale, found_inf)
        elementwise(op("fused_adam_"), ps)(*self._lists(group, ps), lr, beta1, beta2, group["eps"],
                          group["weight_decay"], group["adam_w_mode"], group["bias_correction"],
                          group["amsgrad"], group["maximize"], lr_tensor, grad_scale, found_inf)

    def _lists(self, group, ps):
        make = dict(exp_avg=self._state_zeros, exp_avg_sq=self._state_zeros)
        if group["amsgrad"]:
            make["max_exp_avg_sq"] = self._state_zeros
        states, steps = self._state_lists(group, ps, **make)
        maxes = states[2] if group["amsgrad"] else []
        halves = self._halves(ps)
        if halves is not None:  # amp's masters with their grads, and the model's half params to write
            return halves, [p.grad for p in ps], states[0], states[1], maxes, ps, steps
        return ps, [p.grad for p in ps], states[0], states[1], maxes, self._masters(ps), steps

    def _halves(self, ps):
        """The half params amp's O2 holds for the fp32 params ``ps`` (its masters), for
        this step to write (Note [Half params written in the step] in amp_optimizer.py),
        or None."""
        amp = getattr(self, "_core_ops_amp", None)
        if amp is None or self.master_weights or torch.compiler.is_compiling() or ps[0].dtype != torch.float32:
            return None
        return amp.halves_of(ps)

    def _wrote(self, ps):
        super()._wrote(ps)
        amp = getattr(self, "_core_ops_amp", None)
        if amp is not None:
            amp.halves_written(ps)

    # ---- compact state (compact_state.py) ------------------------------------------

    def _step_compact(self, group, ps, device, lr, lr_tensor, grad_scale, found_inf):
        remainders = self._remainders(group, ps)
        # getattr / setattr, not __dict__.setdefault: torch 2.10's dynamo cannot trace
        # the latter, which broke the compiled step into two graphs there.
        maps = getattr(self, "_maps", None)
        if maps is None:
            maps = self._maps = compact_state.Maps()
        # Only 8-bit moments depend on the param (small tensors keep float32): the others
        # take one dtype for the whole list, found once (this runs every step, per param).
        if self.state_dtype == "int8":
            by_dtype = {}
            for i, p in enumerate(ps):
                by_dtype.setdefault(compact_state.moment_dtype(self.state_dtype, p, self.min_8bit_size), []).append(i)
        else:
            by_dtype = {compact_state.moment_dtype(self.state_dtype, ps[0]): range(len(ps))}
        beta1, beta2 = group["betas"]
        for dtype, indices in by_dtype.items():
            sub = [ps[i] for i in indices] if len(indices) < len(ps) else ps
            states, steps = self._state_lists(group, sub, exp_avg=self._fresh_moments(dtype), exp_avg_sq=None)
            quantized = dtype == torch.uint8
            absmaxes = [self._absmaxes(sub, key) if quantized else [] for key in compact_state.MOMENTS]
            qmaps = maps(device) if quantized else (None, None)
            masters = [remainders[i] for i in indices] if remainders else self._masters(sub)
            elementwise(op("fused_adam_compact_"), sub)(
                sub, [p.grad for p in sub], states[0], states[1], absmaxes[0], absmaxes[1], masters, steps,
                qmaps[0], qmaps[1], lr, beta1, beta2, group["eps"], group["weight_decay"], group["adam_w_mode"],
                group["bias_correction"], group["maximize"], lr_tensor, grad_scale, found_inf)

    def _fresh_moments(self, dtype):
        """_state_lists' maker of a param's moments on its first step: both, with the
        block maxima 8-bit codes come with, put in its state at once (so exp_avg_sq is
        never missing after it); gives exp_avg."""
        def make(p):
            made = compact_state.new_moments(p, dtype)
            self.state[p].update(made)
            return made["exp_avg"]
        return make

    def _absmaxes(self, ps, key):
        """The block maxima of 8-bit ``key`` of each param in ``ps`` (made with it), this
        rank's own under FSDP2 (Note [Block maxima of shards] in compact_state.py)."""
        return [compact_state.block_maxima(self.state[p][f"{key}_absmax"], local(p).numel()) for p in ps]

    def _remainders(self, group, ps):
        """The int16 remainders of ``ps`` (bfloat16 params), or [] (no remainders, or
        float32 params: their own masters). A param written since the last step (Note [Writes to half params])
        restarts from its written value: its remainders are zeroed, as the written
        bfloat16 values carry no lower bits."""
        if self.master_weights != "remainder" or ps[0].dtype != torch.bfloat16:
            return []  # (float16 params were refused by _work)
        marks = None if torch.compiler.is_compiling() else self._write_marks()
        now = _write_marks_of(ps) if marks is not None else [None] * len(ps)
        out = []
        for p, mark in zip(ps, now):
            state = self.state[p]
            if "master_remainder" not in state:
                state["master_remainder"] = torch.zeros_like(p, dtype=torch.int16,
                                                             memory_format=torch.preserve_format)
            elif marks is not None and marks.get(id(p), mark) != mark:
                # (No mark: the first step since a load, which trusts the param.)
                state["master_remainder"].zero_()
            out.append(state["master_remainder"])
        return out

    def _check_loadable(self, state_dict):
        super()._check_loadable(state_dict)
        for saved, p in self._saved_states(state_dict):
            value = saved.get("master_remainder")
            if isinstance(value, torch.Tensor) and (value.shape != p.shape or p.dtype != torch.bfloat16):
                raise ValueError(f"state 'master_remainder' ({value.dtype} {tuple(value.shape)}) belongs to a "
                                 f"bfloat16 param of its shape, not a {p.dtype} param of shape {tuple(p.shape)}")
            for key in compact_state.MOMENTS:
                value = saved.get(key)
                if isinstance(value, torch.Tensor) and value.dtype == torch.uint8:
                    compact_state.check_saved_maxima(saved, key, local(p).numel())

    def _restore_exact(self, state_dict):
        if not self.compact and not _holds_compact(state_dict):
            return super()._restore_exact(state_dict)
        # getattr / setattr, not __dict__.setdefault: torch 2.10's dynamo cannot trace
        # the latter, which broke the compiled step into two graphs there.
        maps = getattr(self, "_maps", None)
        if maps is None:
            maps = self._maps = compact_state.Maps()
        for saved, p in self._saved_states(state_dict):
            state = self.state[p]
            compact_state.convert_loaded(state, saved, p, self.state_dtype, self.master_weights, maps,
                                         self.min_8bit_size)
            for key in ("max_exp_avg_sq",):
                if isinstance(saved.get(key), torch.Tensor):
                    state[key] = self._state_zeros(p).copy_(saved[key])
            if "step" in state:
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(
                    p.device, copy=True).reshape(())


def _holds_compact(state_dict):
    """Whether a saved state dict has compact state (8-bit / bfloat16 moments, remainders)."""
    for saved in state_dict["state"].values():
        if any(k in saved for k in compact_state.COMPACT_KEYS):
            return True
        if any(isinstance(saved.get(k), torch.Tensor) and saved[k].dtype == torch.bfloat16
               for k in compact_state.MOMENTS):
            return True
    return False
