"""``python -m core_ops.compat.apex script.py [args]`` (or ``-m module [args]``): runs
an unmodified Apex training script with Apex's imports served by core_ops."""

import sys

from ..._runner import run
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
    if argv and argv[0] not in ("-h", "--help"):
        install()
        export_to_children()
    return run(argv, USAGE, "core_ops.compat.apex")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
