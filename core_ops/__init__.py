"""core_ops: Apex's fused kernels, mixed precision and data parallelism for modern
PyTorch, on CPU and CUDA, installable with plain pip.

Importing never compiles anything and never fails for want of a compiler or GPU:
native kernels build on first use (Note [Backends] in ``native/``) and every op
has a pure-PyTorch reference to fall back on.
"""

import atexit

from . import _environment, settings

_environment.check()  # a mistyped CORE_OPS_* variable is an error, not a setting ignored
_environment.warn_plugins_without_autoload()  # an editable plugin install says what it lacks
atexit.register(settings.say_unread)  # a set variable that no route read is said at least at the end

from . import _schemas, _fallback  # noqa: F401,E402  (op schemas, then the non-native kernels)
from ._info import backend_report  # noqa: E402
from . import multi_tensor_apply as _mta  # noqa: E402

globals().update({name: getattr(_mta, name) for name in _mta.OPS})  # the multi-tensor ops, at the top
__version__ = "0.1.0"
__all__ = ["backend_report", *_mta.OPS]
