"""core-ops for Hugging Face Accelerate. ``ApexPlugin`` arrives with the AMP and
parallel issues; until then this package only pins the supported Accelerate range."""

__version__ = "0.1.0"
