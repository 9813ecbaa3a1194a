"""What every fused optimizer shares: grouping params by (device, dtype), lazy state,
fp32 master weights, grad_scale / found_inf (torch.amp.GradScaler's fused protocol),
clipping by global norm folded into the update, and state dicts that interoperate
with torch.optim."""

from __future__ import annotations

import itertools
from collections import OrderedDict, defaultdict

import torch
from torch.optim import Optimizer

from .. import _validate, native, settings
from ..multi_tensor_apply.ops import global_l2norm, multi_tensor_check_finite
from ._checks import (check_dense, check_given, check_group_keys, check_hyperparameters,
                      check_scale_args)
from .._sharded import is_sharded, local, locals_of, max_over_meshes, meshes_of
from ..torch_patches import grad_scaler_flags
from .compact_state import check_master_weights

HALF = (torch.float16, torch.bfloat16)


def flag_overflow(found_inf, bad):
    """found_inf |= bad on the device, in place; returns found_inf, or ``bad`` when
    there is none. found_inf may be 0-d (torch's GradScaler, LossScaler) or one-element."""
    if found_inf is None:
        return bad
    bad = bad.to(found_inf.device, found_inf.dtype).reshape(found_inf.shape)
    found_inf.copy_(torch.maximum(found_inf, bad))
    return found_inf


class FusedOptimizer(Optimizer):
    # torch.amp.GradScaler.step() sets self.grad_scale / self.found_inf and lets the
    # step unscale and skip inside the kernel instead of unscaling grads first.
    _step_supports_amp_scaling = True
    # State tensors kept in the state dtype (float32) whatever the param dtype.
    _state_keys: tuple[str, ...] = ()
    # Settings kept as attributes rather than in defaults; torch.optim.Optimizer pickles
    # only defaults, state and param_groups, so these are added (deepcopy, torch.save).
    _pickled_attrs: tuple[str, ...] = ("set_grad_none", "master_weights", "capturable", "_grad_norm",
                                       "skip_nonfinite", "_skips")
    skip_nonfinite = False  # what an optimizer pickled before the guard existed unpickles with

    # Whether master_weights="remainder" (int16 remainders of bfloat16 params) is taken.
    _supports_remainder = False

    def __init__(self, params, defaults, *, set_grad_none, master_weights=False, capturable=False,
                 skip_nonfinite=False):
        self.set_grad_none = set_grad_none
        self.skip_nonfinite = settings.BY_NAME["skip_nonfinite"].parse(skip_nonfinite, "skip_nonfinite")
        self._skips = [None]  # steps the guard skipped, a device tensor (a list: see _grad_norm)
        self.master_weights = check_master_weights(master_weights, self._supports_remainder, type(self).__name__)
        self.capturable = capturable
        # A one-item list written in place: torch 2.6's torch.compile cannot set an
        # attribute of an optimizer without a graph break, and the graph resumed after
        # that break read every grad as None.
        self._grad_norm = [None]
        check_hyperparameters(defaults)
        super().__init__(params, defaults)

    @property
    def skipped_steps(self):
        """Steps that ``skip_nonfinite`` skipped for inf / nan grads (a host sync)."""
        return 0 if self._skips[0] is None else int(self._skips[0])

    @property
    def last_grad_norm(self):
        """The global grad norm of the last step that clipped (max_grad_norm), else None."""
        return self._grad_norm[0]

    def __getstate__(self):
        return {**super().__getstate__(), **{k: getattr(self, k) for k in self._pickled_attrs}}

    def __setstate__(self, state):
        # Runs on load_state_dict and unpickling. Options a loaded group does not hold
        # come from the constructor, as for a group added later: Apex kept some options
        # as attributes (FusedLAMB's adam_w_mode, FusedSGD's wd_after_momentum,
        # FusedNovoGrad's moment mode), torch.optim has none of Apex's. Before that,
        # _complete_group reads what the group says under another name.
        super().__setstate__(state)
        if not isinstance(self.__dict__.get("_skips"), list):  # pickled before the guard existed
            self._skips = [None]
        for group in self.param_groups:
            self._complete_group(group)
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            self._hold_lr_on_device(group)

    def _complete_group(self, group):
        """Sets options of a loaded group that it records under other names."""

    # ---- construction -------------------------------------------------------------

    def add_param_group(self, param_group):
        """torch's, after the checks of ``_check_group`` (the constructor's groups come
        here too), so a rejected group leaves the optimizer as it was."""
        params = param_group["params"]
        if isinstance(params, set):  # its order changes between runs: state dicts would mispair
            raise TypeError("optimizer parameters need to be organized in ordered collections, but "
                            "the ordering of tensors in sets will change between runs. Please use a "
                            "list instead.")
        # A generator (module.parameters()) can be read only once: hand torch the list.
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        param_group["params"] = params
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]  # (name, param) pairs
        if len({id(p) for p in tensors}) != len(tensors):
            raise ValueError(f"{type(self).__name__}: a parameter appears twice in one param group")
        self._check_group({**self.defaults, **param_group, "params": tensors},
                          f"param group {len(self.param_groups)}: ")
        super().add_param_group(param_group)
        self._hold_lr_on_device(self.param_groups[-1])

    def _hold_lr_on_device(self, group):
        """capturable=True (Apex's flag, for CUDA graphs): the group's lr becomes a
        tensor on its params' device, read by the kernel on the device, so a graph
        captured once follows a schedule; torch's LR schedulers fill a tensor lr in
        place. float64 params keep a float64 lr (as a float lr is read for them)."""
        if not getattr(self, "capturable", False) or not group["params"] or isinstance(group["lr"], torch.Tensor) and (
                group["lr"].device == group["params"][0].device):
            return
        p = group["params"][0]
        dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
        lr = group["lr"]
        group["lr"] = (lr.detach().to(p.device, dtype) if isinstance(lr, torch.Tensor)
                       else torch.tensor(float(lr), dtype=dtype, device=p.device))

    def _check_group(self, group, where):
        """Rejects a group (its options merged over the defaults) before it is added;
        subclasses add their own rules."""
        check_group_keys(group, self.defaults, where, type(self).__name__)
        check_given(group, where)
        # Only what this optimizer reads: an SGD group copied from an Adam one may carry
        # an eps that nothing uses. "step" is Apex's per-group count, read by all.
        check_hyperparameters({k: v for k, v in group.items() if k in self.defaults or k == "step"}, where)
        check_dense(group["params"], where)

    # ---- grads --------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool | None = None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def _param_name(self, group, i, p):
        """Where param i of ``group`` is, for an error: its index and shape."""
        g = next((k for k, other in enumerate(self.param_groups) if other is group), "?")
        return f"param_groups[{g}]['params'][{i}] (shape {tuple(p.shape)}, {p.dtype})"

    def _grouped(self, group):
        """Params of ``group`` that have grads, bucketed by (device, dtype), checked as the
        kernels would check them (Note [Checks before updates])."""
        buckets = defaultdict(list)
        for i, p in enumerate(group["params"]):
            grad = p.grad  # read once: each read is a call into torch
            if grad is None:
                continue
            if grad.is_sparse or grad.shape != p.shape:
                where = self._param_name(group, i, p)
                if grad.is_sparse:
                    raise _validate.SparseGradError(
                        f"{type(self).__name__} does not support sparse gradients: {where} has one (an "
                        "nn.Embedding(sparse=True)? use sparse=False, or torch.optim.SparseAdam for those params)")
                raise ValueError(f"{where}: its gradient has shape {tuple(grad.shape)}, the param "
                                 f"{tuple(p.shape)}")
            buckets[(p.device, p.dtype)].append(p)
        for (device, _), ps in buckets.items():
            # A param's .data may have been replaced since it was added. Only the
            # non-contiguous ones need the (Python) density check: this runs every
            # step, and is_contiguous() costs ~0.25 us a param, _dense ~6 us.
            if not all(p.is_contiguous() for p in ps):
                check_dense(ps, f"{type(self).__name__}.step(): ")
            native.ensure_for(device)
        return buckets

    def _work(self):
        """[(group, its buckets)] for every group, all checked before any update."""
        return [(group, self._grouped(group)) for group in self.param_groups]

    # ---- state --------------------------------------------------------------------

    @staticmethod
    def _step_tensor(p, group):
        # Apex counts steps per group (group['step']: its checkpoints, and
        # FusedMixedPrecisionLamb's step=N); a param without a count of its own starts there.
        return torch.as_tensor(group.get("step", 0), dtype=torch.float32).to(p.device, copy=True).reshape(())

    def _state_zeros(self, p):
        return torch.zeros_like(p, dtype=_validate.state_dtype(p.dtype), memory_format=torch.preserve_format)

    def _state_lists(self, group, ps, **make):
        """(one list per name in ``make``, steps): ``state[name]`` of each param in
        ``ps`` (of ``group``), made by ``make[name](p)`` when missing (a first step, or
        amsgrad turned on later), and the step counters. State made for a step that
        is then skipped is the state a first step starts from (zeros, step unchanged)."""
        states = [self.state[p] for p in ps]
        try:  # every step but a first: one subscript a name a param
            return [[state[name] for state in states] for name in make], [state["step"] for state in states]
        except KeyError:
            pass
        lists, steps = {name: [] for name in make}, []
        for p in ps:
            state = self.state[p]
            if "step" not in state:
                state["step"] = self._step_tensor(p, group)
            for name, fn in make.items():
                if name not in state:
                    state[name] = fn(p)
                lists[name].append(state[name])
            steps.append(state["step"])
        return list(lists.values()), steps

    def _masters(self, ps):
        """The fp32 masters of the half params in ``ps`` (made on first use; an empty
        list without master weights). A param written since the last step gives its
        master the new values first (Note [Writes to half params])."""
        if self.master_weights is not True:  # none, or remainders (FusedAdam)
            return []
        # Under torch.compile writes are not looked for: the marks would not persist
        # and the compiled compare would skip the rounding to the half dtype.
        half = [p for p in ps if p.dtype in HALF]
        marks = None if torch.compiler.is_compiling() else self._write_marks()
        now = _write_marks_of(half) if marks is not None else [None] * len(half)
        masters = []
        for p, mark in zip(half, now):
            state = self.state[p]
            master = state.get("master_param")
            if master is None:
                master = state["master_param"] = self._state_zeros(p).copy_(p.detach())
            elif marks is not None and marks.get(id(p)) != mark and master.shape == p.shape:
                # Only the elements that differ: a renormalised embedding row takes its
                # new value, every other element keeps the master's extra bits. (A
                # param of another shape is the kernel's error to report.) On the local
                # shards of DTensors: elementwise, and torch 2.9's DTensor has no rule for ne.
                value, full = local(p.detach()), local(master)
                full.copy_(torch.where(value != full.to(value.dtype), value.to(full.dtype), full))
            masters.append(master)
        return masters

    def _write_marks(self):
        """{id of a half param with a master: its (version, data_ptr) after the last
        step}; ids, as hashing a tensor runs Python code. Not saved: after a copy or a
        load every param is compared once."""
        return self.__dict__.setdefault("_marks", {})

    # ---- scaling, skipping, clipping ---------------------------------------------

    def _scaling(self, work, grad_scale, found_inf, max_grad_norm, clip_eps=1e-6):
        """(grad_scale, found_inf) to hand the kernels: the caller's, or GradScaler's,
        with clipping by global norm folded into grad_scale (no host sync)."""
        grad_scale = grad_scale if grad_scale is not None else getattr(self, "grad_scale", None)
        found_inf = found_inf if found_inf is not None else getattr(self, "found_inf", None)
        if found_inf is None:  # amp's overflow flag, read here (Note [amp's flag in the step])
            amp = getattr(self, "_core_ops_amp", None)
            found_inf = None if amp is None else amp.step_flag()
        if max_grad_norm is None:
            return grad_scale, found_inf
        if max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        lists = [ps for _, buckets in work for ps in buckets.values()]
        if not lists:
            return grad_scale, found_inf
        total = global_l2norm([[p.grad for p in ps] for ps in lists], "step(max_grad_norm=...): ")
        device, dtype = total.device, total.dtype
        if grad_scale is not None:
            total = total / grad_scale.to(device, dtype).reshape(())
        found_inf = self._flag_overflow(found_inf, (~torch.isfinite(total)).float().reshape(1))
        self._grad_norm[0] = total
        # grads / (scale / clip) = unscaled grads * clip, clip = min(1, max_norm / norm)
        # clip_eps=1e-6 as torch.nn.utils.clip_grad_norm_; LAMB passes 0 (Apex's
        # max_norm / max(norm, max_norm)).
        clip = torch.clamp(max_grad_norm / (total + clip_eps), max=1.0)
        divisor = clip.reciprocal() if grad_scale is None else grad_scale.to(device) / clip
        return divisor.reshape(1), found_inf

    def _flag_overflow(self, found_inf, bad):
        """found_inf |= bad for a norm that overflowed float32 although every grad was
        finite (a skipped step, so that the loss scale backs off), told to the loss
        scaler that is stepping this optimizer, if any (Note [Overflowing norms])."""
        # Under torch.compile the stack cannot be walked (a graph break there loses
        # the grads); a norm overflowing there still skips the step, but torch's
        # GradScaler does not back off for it.
        if getattr(self, "found_inf", None) is not None and not torch.compiler.is_compiling():
            scaler_flag = grad_scaler_flags.found_inf_of_calling_scaler(self)
            if scaler_flag is not None:
                flag_overflow(scaler_flag, bad)
        return flag_overflow(found_inf, bad)

    # ---- the step ---------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale=None, found_inf=None, max_grad_norm=None, **scaler):
        """One update, one fused op call per (device, dtype) group of params.
        ``grad_scale``: grads are divided by it inside the kernel. ``found_inf``: a
        one-element tensor; when set, nothing changes (params, state, step counts).
        ``max_grad_norm``: clip by the global norm of the unscaled grads, in the same
        pass; the norm is kept in ``self.last_grad_norm`` and a non-finite norm sets
        ``found_inf`` (which is updated in place when given). ``grad_scaler=s``: the
        same as ``s.step(self)``, see ``_step_with_scaler``. Every param group is
        checked before the first update (Note [Checks before updates])."""
        if scaler:
            return self._step_with_scaler(closure, **scaler)
        check_scale_args(grad_scale, found_inf)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = self._work()
        grad_scale, found_inf = self._scaling(work, grad_scale, found_inf, *self._clipping(max_grad_norm))
        if self.skip_nonfinite:
            found_inf = self._guard(work, found_inf)
        for group, buckets in work:
            for (device, _), ps in buckets.items():
                self._step_group(group, ps, device, self._on(grad_scale, device),
                                 self._on(found_inf, device))
                self._wrote(ps)
        return loss

    def _guard(self, work, found_inf):
        """skip_nonfinite (Note [Skipping non-finite steps]): found_inf |= any grad holds
        an inf or nan, by one read-only pass over the grads on the device (FSDP2: over
        every rank's shards), so the kernels skip the whole step; the skip is counted."""
        flag = None
        grads = [p.grad for _, buckets in work for ps in buckets.values() for p in ps]
        for _, buckets in work:
            for ps in buckets.values():
                bad = multi_tensor_check_finite(locals_of([p.grad for p in ps])).reshape(())
                flag = bad if flag is None else torch.maximum(flag, bad.to(flag.device))
        if flag is None:
            return found_inf
        flag = max_over_meshes(flag, meshes_of(grads))
        found_inf = flag_overflow(found_inf, flag.reshape(1))
        skipped = (found_inf.reshape(()) > 0).to(torch.int64)
        self._skips[0] = skipped if self._skips[0] is None else self._skips[0] + skipped.to(self._skips[0].device)
        return found_inf

    def _wrote(self, ps):
        """After the kernels wrote ``ps``: their version counters move on, as torch's
        in-place ops do, so autograd refuses a backward through a graph that saved
        their old values (a step between a forward and its backward); then the marks of
        Note [Writes to half params] are taken."""
        increment_version(ps)
        if self.master_weights and not torch.compiler.is_compiling():
            half = [p for p in ps if p.dtype in HALF]
            self._write_marks().update(zip(map(id, half), _write_marks_of(half)))

    def _clipping(self, max_grad_norm):
        """(max_grad_norm, clip_eps) for ``_scaling``; LAMB clips its own way."""
        return max_grad_norm, 1e-6

    def _step_group(self, group, ps, device, grad_scale, found_inf):
        """The fused op call for params ``ps`` of ``group`` on ``device``, whose grads
        are checked; ``grad_scale`` / ``found_inf`` are already on ``device``."""
        raise NotImplementedError

    def _step_with_scaler(self, closure=None, grad_scaler=None, **unknown):
        """``step(grad_scaler=s)`` is ``s.step(self)``, for a ``torch.amp.GradScaler`` or
        a ``core_ops.amp.LossScaler``: the scaler's scale and overflow flag go into the
        kernel, nothing syncs, and an overflowed step changes nothing; call
        ``s.update()`` after it as usual. (The keyword stays out of the signature, where
        torch's GradScaler would take it for its deprecated protocol.)"""
        if unknown:
            raise TypeError(f"{type(self).__name__}.step() got unexpected keyword arguments "
                            f"{sorted(unknown)}")
        if grad_scaler is None:
            return self.step(closure)
        if closure is not None:
            raise RuntimeError("step(grad_scaler=...) takes no closure: it would run backward after "
                               "the overflow check")
        return grad_scaler.step(self)

    @staticmethod
    def _on(t, device):
        return None if t is None else t.to(device, non_blocking=True)

    def _lr(self, group, device):
        """(lr as float, lr as a device tensor or None) for the kernel."""
        return _validate.lr_arg(group["lr"], device)

    # ---- state dicts --------------------------------------------------------------

    def load_state_dict(self, state_dict):
        """torch.optim's loader casts state to the param dtype; core_ops keeps it (and
        master weights) in float32, so those are restored from the saved values
        exactly, in the param's memory layout, and steps move to the param's device.
        A state dict that does not fit is rejected before anything is loaded.

        That work runs as the last load pre-hook and the first load post-hook, so the
        user's hooks act as on torch.optim: a pre-hook's edits (a grown vocabulary's
        padded state) are what is checked and loaded, and a post-hook sees the loaded
        state and has the last word."""
        loaded = []

        def prepare(optimizer, state_dict):
            state_dict = self._prepare_loaded(state_dict)
            self._check_loadable(state_dict)
            loaded.append(state_dict)
            return state_dict

        def restore(optimizer):
            self._restore_exact(loaded[0])
            # The loaded state goes with the params as they are now or as they will be
            # loaded (torch.distributed.checkpoint loads a model after a step that made the
            # optimizer's state): writes before the load are not the user's (Note [Writes
            # to half params]).
            self._write_marks().clear()

        # This call's own copies of the hook dicts, with ours added: a load started from
        # inside a user's hook must not change the dicts an outer load is iterating. (A
        # hook registered while a load runs lasts for that load only.)
        names = ("_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")
        users = [getattr(self, name) for name in names]
        key = object()
        setattr(self, names[0], OrderedDict([*users[0].items(), (key, prepare)]))
        setattr(self, names[1], OrderedDict([(key, restore), *users[1].items()]))
        try:
            super().load_state_dict(state_dict)
        finally:
            for name, hooks in zip(names, users):
                setattr(self, name, hooks)

    def _prepare_loaded(self, state_dict):
        """The state dict to load, from the one given after the user's pre-hooks (a
        subclass converts other formats here)."""
        return state_dict

    def _restore_exact(self, state_dict):
        """Puts back in float32 the state torch's loader cast to the param dtype."""
        for saved, p in self._saved_states(state_dict):
            state = self.state[p]
            for key in (*self._state_keys, "master_param"):
                value = saved.get(key)
                if isinstance(value, torch.Tensor):
                    state[key] = self._state_zeros(p).copy_(value)
            if "step" in state:
                # A copy: torch's loader may hand back the very tensor of the source
                # optimizer, and both would then count every step.
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(
                    p.device, copy=True).reshape(())

    def _saved_states(self, state_dict):
        """(saved state, param) pairs, by position as torch's loader pairs them."""
        ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
        return [(state_dict["state"][pid], p) for pid, p in zip(ids, params) if state_dict["state"].get(pid)]

    def _check_loadable(self, state_dict):
        """Raises if the saved state cannot belong to these params. Group counts and
        sizes that differ are left to torch's loader, which rejects them first too."""
        for saved, p in self._saved_states(state_dict):
            for key in (*self._state_keys, "master_param"):
                value = saved.get(key)
                if isinstance(value, torch.Tensor) and value.shape != p.shape:
                    raise ValueError(f"state '{key}' of a param has shape {tuple(value.shape)} but the "
                                     f"param has shape {tuple(p.shape)}: the state dict is from another model")


# Note [Writes to half params]: with master_weights the kernel writes each half param
# from its fp32 master, so a write to the half param between steps (nn.Embedding's
# max_norm renormalising rows in forward, p.clamp_() for weight clipping, a
# model.load_state_dict) would be overwritten by the next step. Apex's fused optimizers
# did that. Each step notes every such param's version counter and storage; a param
# whose mark has changed by the next step has been written (in place, or given new
# .data), and its changed elements go into the master (not inside torch.compile).
# Comparing every param's values at every step would read 6 bytes an element, ~20% of
# an Adam step; the marks cost two attribute reads a param. Writes through ``p.data``
# in place (``p.data.clamp_()``) bump no version counter and are not seen: write under
# torch.no_grad() instead.

def _write_marks_of(ps):
    """Each param's (version counter, data_ptr): a write in place or new .data moves it."""
    if any(map(is_sharded, ps)):
        return [(p._version, p.to_local().data_ptr()) for p in ps]
    return [(p._version, p.data_ptr()) for p in ps]


def increment_version(tensors):
    """torch.autograd.graph.increment_version of every tensor in ``tensors``."""
    try:
        torch.autograd.graph.increment_version(tensors)
    except TypeError:  # torch < 2.5 takes one tensor at a time
        for t in tensors:
            torch.autograd.graph.increment_version(t)


# Note [Overflowing norms]: finite grads can have a norm that overflows float32 (LAMB's
# clipping norm, NovoGrad's layer norms); the step is then skipped through found_inf.
# torch.amp.GradScaler hands the step a found_inf it sums afresh for each step and, in
# update(), reads only its own per-device flags, so the flag is OR-ed into those as
# well (on the device, no sync; found by torch_patches/grad_scaler_flags.py); otherwise
# the scale would keep growing while every step is skipped. core_ops' LossScaler hands
# over the very flag its update() reads.
