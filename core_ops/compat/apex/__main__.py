"""``python -m core_ops.compat.apex script.py [args]`` (or ``-m module [args]``): runs
an unmodified Apex training script with Apex's imports served by core_ops."""

import os
import runpy
import sys

from . import export_to_children, install

USAGE = "usage: python -m core_ops.compat.apex script.py [args...]  |  -m module [args...]"


def _script_first(argv):
    """``python -m torch.distributed.launch ... -m core_ops.compat.apex train.py`` puts
    its ``--local-rank=N`` (or ``--local_rank``) before the script: it is the script's
    argument, as when the launcher runs ``train.py`` itself, so it moves behind it."""
    ranks = []
    while argv and argv[0].startswith(("--local-rank", "--local_rank")):
        takes_value = "=" not in argv[0] and len(argv) > 1
        ranks += argv[:2] if takes_value else argv[:1]
        argv = argv[2:] if takes_value else argv[1:]
    if not ranks or not argv:
        return ranks + argv
    head = 2 if argv[0] == "-m" else 1
    return argv[:head] + ranks + argv[head:]


def main(argv):
    argv = _script_first(list(argv))
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    install()
    export_to_children()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"core_ops.compat.apex: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
