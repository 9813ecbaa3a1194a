"""core-ops for Hugging Face Accelerate. ``ApexPlugin`` is not built yet: its engine,
``core_ops.amp`` and ``core_ops.parallel``, exists; the plugin waits for its own issue.
Until then this package only pins the supported Accelerate range."""

__version__ = "0.1.0"
