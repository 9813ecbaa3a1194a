"""Running ``script.py [args]`` or ``-m module [args]`` as ``python`` would, for the
``python -m <tool> ...`` wrappers (core_ops.compat.apex, core_ops_accelerate) that set
something up first."""

import os
import runpy
import sys


def run(argv, usage, prog):
    """Runs what ``argv`` names (after ``prog``'s own set-up); returns the exit code:
    0, or 2 with the usage (or a missing script) on stderr."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] == "-m":
        if len(argv) < 2:
            print(usage, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"{prog}: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
    runpy.run_path(script, run_name="__main__")
    return 0
