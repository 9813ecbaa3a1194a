"""core-ops for PyTorch Lightning. The precision plugin (``precision="apex-O2"``) and
the strategy (``strategy="apex-ddp"``) arrive with the AMP and parallel issues; until
then this package only pins the supported Lightning range."""

__version__ = "0.1.0"
