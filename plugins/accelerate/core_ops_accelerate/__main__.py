"""``python -m core_ops_accelerate script.py [args]`` (or ``-m module [args]``), and so
``accelerate launch -m core_ops_accelerate script.py``: runs an unmodified Accelerate
script with ``ApexPlugin()`` in every Accelerator it builds when ``CORE_OPS_OPT_LEVEL``
is set (the other ``CORE_OPS_*`` variables fill the plugin's options); without it the
script runs as it would."""

import sys

from core_ops._runner import run

from . import _compat

USAGE = "usage: python -m core_ops_accelerate script.py [args...]  |  -m module [args...]"


def main(argv):
    _compat.AUTO["on"] = True
    return run(list(argv), USAGE, "core_ops_accelerate")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
