"""core-ops for PyTorch Lightning. The precision plugin (``precision="apex-O2"``) and
the strategy (``strategy="apex-ddp"``) are not built yet: their engine,
``core_ops.amp`` and ``core_ops.parallel``, exists; they wait for their own issue.
Until then this package only pins the supported Lightning range."""

__version__ = "0.1.0"
