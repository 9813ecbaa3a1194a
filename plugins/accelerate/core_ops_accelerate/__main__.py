"""``python -m core_ops_accelerate script.py [args]`` (or ``-m module [args]``), and so
``accelerate launch -m core_ops_accelerate script.py``: runs an unmodified Accelerate
script with ``ApexPlugin()`` in every Accelerator it builds when ``CORE_OPS_OPT_LEVEL``
is set (the other ``CORE_OPS_*`` variables fill the plugin's options); without it the
script runs as it would."""

import os
import runpy
import sys

from . import _compat

USAGE = "usage: python -m core_ops_accelerate script.py [args...]  |  -m module [args...]"


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    _compat.AUTO["on"] = True
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"core_ops_accelerate: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
