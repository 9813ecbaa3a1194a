"""What ``initialize`` attaches to an optimizer: its fp32 master params (O2), the
unscaling of grads after each ``scale_loss`` backward, and the skipping of an
overflowed step.

Note [O2 master weights]: the optimizer's param groups hold float32 masters (made from
the model's float32 weights before the model is cast, so nothing is rounded at
start-up); the model holds the half params. After each backward the half grads are
unscaled into the masters' grads in one multi-tensor pass (which also checks for
inf/nan) and dropped, so half grads never accumulate behind the optimizer's back.
After each step the masters are copied into the half params in one pass, and the
masters' grads are spent: the next backward overwrites them (a master whose half
param gets no grad there loses its grad), as Apex cleared them after each step. So
zeroing the model's grads by hand (``p.grad = None`` on the half params, which never
reach the masters) cannot leave stale master grads behind; their memory is reused.

Skipping (Note [Host syncs of loss scaling]): an optimizer that takes ``found_inf``
in its kernel (``_step_supports_amp_scaling``) gets the flag and skips by itself;
any other is told on the host, once per step, and runs with no grads (so it changes
nothing), after which the grads are put back.

Note [amp's flag in the step]: core_ops' fused optimizers read the flag themselves
(``FusedOptimizer._scaling`` asks ``step_flag()``), so nothing runs before their step
and what runs after it (the masters copied into the half params) is plain tensor
work: ``torch.compile`` traces scale_loss, backward and step as one graph, and the
skip is decided on the device. Other optimizers get the flag from a step pre-hook
that sets torch's GradScaler attributes (torch's fused Adam) or syncs the host; those
hooks run eagerly (``torch.compiler.disable``): traced, dynamo dropped the attributes
the hook set before the step read them, and an overflowed step went through.
"""

from __future__ import annotations

from collections import defaultdict
import functools

import torch

from .._sharded import is_sharded, locals_of, max_over_meshes, meshes_of
from ..multi_tensor_apply import multi_tensor_scale
from ..optimizers._base import FusedOptimizer, _write_marks_of, increment_version
from ..optimizers.larc import LARC


def _group(pairs):
    groups = defaultdict(list)
    for a, b in pairs:
        groups[(a.device, a.dtype, b.dtype)].append((a, b))
    return groups.values()


def _unscale_sparse(grad, inv):
    """A sparse grad (``nn.Embedding(sparse=True)``) divided by the scale, in float32,
    and its overflow flag. The multi-tensor ops take dense tensors only; sparse grads
    are rare and small, so plain ops do. fp16 grads are coalesced first (sums of
    duplicate indices could overflow), as torch's GradScaler does."""
    if grad.dtype is torch.float16:
        grad = grad.coalesce()
    values = grad._values().float() * inv.to(grad.device)
    flag = (~torch.isfinite(values).all()).float().reshape(1)
    out = torch.sparse_coo_tensor(grad._indices(), values, grad.shape, check_invariants=False,
                                  is_coalesced=grad.is_coalesced())
    return out, flag


def _nothing():
    return None


def check_keeps_remainders(optimizer, where="", routed=None):
    """Raises unless ``optimizer`` can keep master remainders (master_weights="remainder");
    ``routed`` (a settings.Resolved) names the variable or argument that asked for them."""
    from ..optimizers.fused_adam import FusedAdam
    inner = optimizer.optim if isinstance(optimizer, LARC) else optimizer
    if not isinstance(inner, FusedAdam):
        said = routed.where("master_weights") if routed is not None else "master_weights='remainder'"
        fix = routed.how_to_set("master_weights", "True", "1") if routed is not None else "pass master_weights=True"
        twin = (f"; a plugin's fused_optimizer swaps in FusedAdam for torch's {type(inner).__name__} itself"
                if type(inner).__name__ in ("Adam", "AdamW") else "")
        raise ValueError(f"{where}{said} keeps the masters' lower halves inside core_ops.optimizers.FusedAdam's "
                         f"step, and this optimizer is {type(inner).__module__}.{type(inner).__name__}: use "
                         f"FusedAdam, or {fix} (fp32 masters){twin}")
    if any("master_param" in s for s in inner.state.values()):
        raise ValueError(f"{where}master_weights=\"remainder\": this FusedAdam already holds fp32 masters (it "
                         "stepped with master_weights=True): call amp.initialize before the first step")


class AmpOptimizer:
    """The amp state of one optimizer (``optimizer._core_ops_amp``)."""

    def __init__(self, optimizer, masters, state):
        self.optimizer = optimizer
        # LARC wraps an optimizer and is not one itself: hooks go on the inner one.
        self.inner = optimizer.optim if isinstance(optimizer, LARC) else optimizer
        self.masters = masters  # a MasterWeights (O2), or None: no masters
        self.state = state  # the AmpState of this optimizer's initialize (its scalers)
        self.pairs = []  # (half model param, fp32 master)
        self._half_of = {}  # id(master) -> its half param
        self._handed = set()  # ids of masters whose half params a step's op was given
        self._written = {}  # id(master) -> its version once the step wrote its half param
        self.fp32_params = []
        for group in self.inner.param_groups:
            self._adopt(group)
        self.found_inf = None  # overflow flag of the backward passes since the last step
        self.last_found_inf = None  # the flag the last step was given
        self._old_nonfinite = None  # inf / nan in grads rescaled by prepare_backward
        self._adopted_written = False
        self._marks = {}  # id(half param) -> (version, data_ptr) after the last step wrote it
        self._stepped = False  # the masters' grads are from before the last step
        # Apex's names, which training scripts reach into (NVIDIA's BERT resumes with
        # optimizer._lazy_init_maybe_master_weights(); _amp_stash.lazy_init_called = True):
        # masters exist from initialize on, so the lazy init has nothing left to do.
        self.lazy_init_called = True
        optimizer._amp_stash = self
        optimizer._lazy_init_maybe_master_weights = _nothing
        self.params_have_scaled_gradients = False
        self._stash = {}
        self._held_grads = None
        self._flag_handed = False
        # Note [amp's flag in the step]: a core_ops optimizer stepped directly reads
        # the flag itself; LARC's inner optimizer is stepped by LARC, which amp wraps.
        self._step_reads_flag = isinstance(self.inner, FusedOptimizer) and self.inner is self.optimizer
        if not self._step_reads_flag:
            self.inner.register_step_pre_hook(self._pre_step)
        self.inner.register_step_post_hook(self._post_step)
        self._patch_zero_grad()
        self._patch_add_param_group()

    def keep_remainders(self, seeds):
        """master_weights="remainder": the optimizer (core_ops' FusedAdam) keeps the fp32
        masters of its bfloat16 params as remainders, starting from ``seeds`` (taken from
        the float32 weights before the cast, preparation.remainder_seeds)."""
        check_keeps_remainders(self.inner, routed=self.state.routed)
        self.inner.master_weights = "remainder"
        for group in self.inner.param_groups:
            for p in group["params"]:
                seed = seeds.get(id(p))
                if seed is not None and seed[0] is p and "master_remainder" not in self.inner.state[p]:
                    self.inner.state[p]["master_remainder"] = seed[1]

    @property
    def all_fp16_params(self):  # Apex's stash names (O2: the model's half params)
        return [p for p, _ in self.pairs]

    @property
    def all_fp32_from_fp16_params(self):  # ... and their fp32 masters
        return [m for _, m in self.pairs]

    def _adopt(self, group):
        """Puts the masters of ``group``'s half params in their place (Note [O2 master
        weights]) and records what to unscale after each backward."""
        mastered = {id(m) for _, m in self.pairs}
        found = [(p, None if self.masters is None else self.masters.get_or_make(p))
                 for p in group["params"]]
        for p, master in found:  # checked before anything changes
            if master is not None and id(master) in mastered:
                raise ValueError(f"a param of shape {tuple(p.shape)} is already in another param "
                                 "group (through its fp32 master); add each param once")
        for i, (p, master) in enumerate(found):
            if master is None:
                self.fp32_params.append(p)
                continue
            group["params"][i] = master
            if p in self.inner.state:  # stepped before initialize: the state follows
                self.inner.state[master] = self.inner.state.pop(p)
            self.pairs.append((p, master))
            self._half_of[id(master)] = p

    # Note [Half params written in the step]: core_ops' FusedAdam, stepped directly on
    # the CPU, writes the half params from the masters inside its update (Note [Master
    # grads] in optimizer_args.h), so the copy after the step skips them: the same
    # bits (the masters rounded to nearest even) without a second pass over the model.
    # It asks halves_of before its op and tells halves_written after; a master whose
    # version moved since (another write) is copied as before.

    def halves_of(self, masters):
        """The half params of ``masters`` (one list of one device and dtype, unsharded,
        on the CPU), or None where the copy after the step must write them."""
        if not self._step_reads_flag or masters[0].device.type != "cpu":
            return None
        halves = [self._half_of.get(id(m)) for m in masters]
        if any(h is None for h in halves) or any(map(is_sharded, masters)):
            return None
        dtype = halves[0].dtype
        if any(h.dtype != dtype or h.stride() != m.stride() for h, m in zip(halves, masters)):
            return None
        self._handed.update(map(id, masters))
        return halves

    def halves_written(self, masters):
        """After an optimizer's op wrote ``masters``: those whose half params it was
        given (halves_of) count as written, at their versions now."""
        if self._handed:
            self._written.update((id(m), m._version) for m in masters if id(m) in self._handed)
            self._handed.difference_update(map(id, masters))

    def _patch_add_param_group(self):
        # Groups added after initialize (progressive unfreezing) are unscaled and, at
        # O2, get masters, as Apex's patched add_param_group did.
        add_param_group = self.inner.add_param_group

        def add_param_group_with_amp(param_group):
            add_param_group(param_group)
            try:
                self._adopt(self.inner.param_groups[-1])
            except ValueError:
                self.inner.param_groups.pop()
                raise

        self.inner.add_param_group = add_param_group_with_amp

    def _patch_zero_grad(self):
        zero_grad = self.optimizer.zero_grad

        # wraps: callers read the signature (Accelerate passes set_to_none only where
        # inspect.signature shows it)
        @functools.wraps(zero_grad)
        def zero_grad_with_model(*args, **kwargs):
            zero_grad(*args, **kwargs)
            for p, _ in self.pairs:
                p.grad = None
            self._stash.clear()
            self.params_have_scaled_gradients = False

        self.optimizer.zero_grad = zero_grad_with_model

    # ---- around backward ----------------------------------------------------------

    # Note [Accumulating under amp]: grads already present before a scale_loss backward
    # (an earlier loss of the same step, micro-batches of gradient accumulation, grads
    # zeroed in place) are unscaled; the coming backward adds grads scaled by this
    # loss's scale. For the optimizer's own params (all at O1; BatchNorm's at O2)
    # Apex set the old grads aside and added them back after unscaling the new ones.
    # That breaks under data parallelism: DDP reduces only what the backward
    # produced, so set-aside grads of a no_sync micro-batch were never reduced (the
    # ranks diverged), and core_ops' DDP writes reduced grads into bucket views that
    # the set-aside tensors still pointed at (grads doubled or lost). Instead the old
    # grads are multiplied by this scale in place: the backward accumulates scaled
    # onto scaled, DDP reduces the sum, post_backward unscales it. Dynamic loss scales
    # are powers of two, so the round trip is exact (a static scale that is not adds
    # one float32 rounding per accumulated backward). An inf / nan already in the old
    # grads was reported by its own backward, so it is not counted again. Half grads
    # of params without masters (O3) are still set aside: rescaled, their sum could
    # overflow the half dtype. At O2 the half params' grads are
    # unscaled into the masters' float32 grads after each backward and summed there,
    # as in Apex (summing in the half dtype would round); each backward's half grads
    # are reduced by DDP before that, so only DDP's no_sync() at O2 needs Apex's rule:
    # delay_unscale=True for the micro-batches inside it.

    def adopt_written_weights(self):
        """Before a backward: the elements of half params written since the last step
        (or, the first time, since ``initialize``) go into their masters (Note [Writes
        to O2 half params]); found by the params' version counters and storages, two
        attribute reads a param."""
        # Under torch.compile the marks (version counters, data pointers) cannot be
        # read in the graph: writes are not looked for there, as in the optimizers.
        if self.masters is None or not self.pairs or torch.compiler.is_compiling():
            return
        halves = [p for p, _ in self.pairs]
        now = dict(zip(map(id, halves), _write_marks_of(halves)))
        if not self._adopted_written:
            written = None
        else:
            written = {key for key, mark in now.items() if self._marks.get(key) != mark}
            if not written:
                return
        self.masters.adopt_written(written)
        self._marks = now
        self._adopted_written = True

    def prepare_backward(self, scale):
        """Rescales present float32 grads by ``scale`` (Note [Accumulating under amp]);
        sets aside sparse grads and half grads of params without masters (O3: their
        rescaled sum could overflow the half dtype), to be added after unscaling."""
        self._old_nonfinite = None
        with torch.no_grad():
            wide = [p for p in self.fp32_params if p.grad is not None and not p.grad.is_sparse
                    and p.grad.dtype in (torch.float32, torch.float64)]
            for group in _group((p.grad, p.grad) for p in wide):
                grads = locals_of([g for g, _ in group])
                flag = multi_tensor_scale(grads, grads, scale.to(grads[0].device))
                # An earlier backward's inf / nan, already reported: not this one's.
                flag = flag.reshape(()).to(scale.device)
                self._old_nonfinite = flag if self._old_nonfinite is None else torch.maximum(
                    self._old_nonfinite, flag)
            kept = {id(p) for p in wide}
            for p in self.fp32_params:
                if p.grad is not None and id(p) not in kept:
                    self._stash[p] = p.grad
                    p.grad = None
            for p, _ in self.pairs:
                p.grad = None

    def post_backward(self, scale):
        """Unscales the grads (into the masters for O2); returns the overflow flag
        (float32, on ``scale``'s device)."""
        found = torch.zeros(1, dtype=torch.float32, device=scale.device)
        inv = torch.reciprocal(scale.double()).float()

        def unscale(src, dst):
            flag = multi_tensor_scale(src, dst, inv.to(src[0].device))
            return torch.maximum(found, flag.to(found.device))

        with torch.no_grad():
            if self._stepped:  # the first backward since a step (Note [O2 master weights])
                for p, m in self.pairs:
                    if p.grad is None or p.grad.is_sparse or (m.grad is not None and m.grad.is_sparse):
                        m.grad = None
                self._stepped = False
                spent = {id(m) for _, m in self.pairs}
            else:
                spent = set()
            halves = [(p, m) for p, m in self.pairs if p.grad is not None and not p.grad.is_sparse]
            for group in _group((p.grad, m) for p, m in halves):
                fresh = [(g, m) for g, m in group if m.grad is None or id(m) in spent]
                added = [(g, m) for g, m in group if m.grad is not None and id(m) not in spent]
                for _, m in fresh:
                    if m.grad is None:
                        m.grad = torch.empty_like(m)
                if fresh:
                    found = unscale([g for g, _ in fresh], [m.grad for _, m in fresh])
                if added:
                    tmp = [torch.empty_like(m) for _, m in added]
                    found = unscale([g for g, _ in added], tmp)
                    dense = [(m, t) for (_, m), t in zip(added, tmp) if not m.grad.is_sparse]
                    if dense:  # in place: the masters' grads keep their memory
                        torch._foreach_add_([m.grad for m, _ in dense], [t for _, t in dense])
                    for (_, m), t in zip(added, tmp):
                        if m.grad.is_sparse:
                            m.grad = m.grad + t
            for p, m in self.pairs:
                if p.grad is not None and p.grad.is_sparse:
                    g, flag = _unscale_sparse(p.grad, inv)
                    m.grad = g if m.grad is None else m.grad + g
                    found = torch.maximum(found, flag.to(found.device))
                p.grad = None
            fulls = [p for p in self.fp32_params if p.grad is not None]
            for group in _group((p.grad, p.grad) for p in fulls if not p.grad.is_sparse):
                grads = locals_of([g for g, _ in group])  # FSDP2: each rank its shards
                flag = multi_tensor_scale(grads, grads, inv.to(grads[0].device)).to(found.device)
                if self._old_nonfinite is not None and grads[0].dtype in (torch.float32, torch.float64):
                    flag = flag * (self._old_nonfinite == 0)  # rescaled old grads: counted before
                found = torch.maximum(found, flag)
            for p in fulls:
                if p.grad.is_sparse:
                    p.grad, flag = _unscale_sparse(p.grad, inv)
                    found = torch.maximum(found, flag.to(found.device))
            for p, g in self._stash.items():
                if p.grad is None:
                    p.grad = g
                elif p.grad.is_sparse or g.is_sparse:
                    p.grad = p.grad + g
                else:
                    p.grad.add_(g)
            self._stash.clear()
            self._old_nonfinite = None
            # An overflow in one rank's shards skips the step on every rank (FSDP2).
            found = max_over_meshes(found, meshes_of(p.grad for p in fulls))
        self.found_inf = found if self.found_inf is None else torch.maximum(self.found_inf, found)
        return found

    # ---- around step -----------------------------------------------------------------

    def step_flag(self):
        """The overflow flag the coming step skips on (0-d, as torch's fused optimizers
        take it), or None when no backward checked since the last step."""
        return None if self.found_inf is None else self.found_inf.reshape(())

    @torch.compiler.disable
    def _pre_step(self, optimizer, args, kwargs):
        if self.found_inf is None:
            return None
        if getattr(self.inner, "_step_supports_amp_scaling", False) and self.inner is self.optimizer:
            self.inner.grad_scale = None
            self.inner.found_inf = self.step_flag()
            self._flag_handed = True
        elif self.found_inf.item():  # the one host sync of a step (see the module note)
            self._held_grads = [(p, p.grad) for g in self.inner.param_groups for p in g["params"]]
            for p, _ in self._held_grads:
                p.grad = None
        return None

    @torch.compiler.disable
    def _undo_pre_step(self):
        if self._flag_handed:
            del self.inner.grad_scale, self.inner.found_inf
            self._flag_handed = False
        if self._held_grads is not None:
            for p, g in self._held_grads:
                p.grad = g
            self._held_grads = None

    def _post_step(self, optimizer, args, kwargs):
        if not self._step_reads_flag:
            self._undo_pre_step()
        self.last_found_inf = self.found_inf  # what the step just taken was told (None: clear)
        self.found_inf = None
        self._stepped = True
        written, self._written = self._written, {}
        pending = [(p, m) for p, m in self.pairs if written.get(id(m)) != m._version] if written else self.pairs
        with torch.no_grad():
            for group in _group((m, p) for p, m in pending):
                multi_tensor_scale([m for m, _ in group], [p for _, p in group], 1.0)
            # Written behind autograd's back (here or in the step: Note [Half params
            # written in the step]): the version counters move on as for torch's
            # copy_, so a backward through the old half weights fails.
            halves = [p for p, _ in self.pairs]
            if halves:
                increment_version(halves)
        # Under torch.compile the marks cannot be read: they stay as they were, and
        # the next eager backward compares every half param with its master once
        # (Note [Writes to O2 half params]: an unwritten element keeps its master).
        if not torch.compiler.is_compiling():
            halves = [p for p, _ in self.pairs]
            self._marks = dict(zip(map(id, halves), _write_marks_of(halves)))  # what the step wrote
