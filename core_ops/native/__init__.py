"""Where each op's kernel comes from.

Note [Backends]: every op runs on the first of four backends that serves it:
  1. wheel: the native library the installed wheel carries (core_ops/lib/, Note
     [Prebuilt libraries] in loader.py), when this torch and machine can load it;
  2. jit: the native library built here from ``csrc/`` at first use and kept in the
     cache (Note [Native build] in cache.py), or one built elsewhere into the cache;
  3. torch: for the ops whose math torch has as one fused kernel, that kernel, when the
     call's arguments are ones it takes (Note [Torch's fused kernels] in
     core_ops/torch_fused.py);
  4. reference: the pure-PyTorch kernel (core_ops/reference/), for everything else.
Backends 1 and 2 serve a whole device type: the first library that loads registers a
kernel for every op under the device's dispatch key (loader.py tries them in order and
keeps why each was passed over). Backends 3 and 4 are one CompositeExplicitAutograd
kernel per op (core_ops/_fallback.py), which a native kernel overrides for its device.
``CORE_OPS_BACKEND=jit`` passes backend 1 over; ``CORE_OPS_BACKEND=reference`` every
backend but 4. ``python -m core_ops info`` names, per device type, the backend taken and
why each before it was not, and each op's backend.

The modules: toolchain.py (compiler, ninja, CUDA toolkit), build.py (the compile),
cache.py (key, trust, lock), loader.py (the order, and loading).
"""

from .loader import KINDS, LOOK, Backend, Request, cpu_level, ensure, ensure_for, forced_reference

__all__ = ["KINDS", "LOOK", "Backend", "Request", "cpu_level", "ensure", "ensure_for", "forced_reference"]
