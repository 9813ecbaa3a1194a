"""``python -m core_ops.compat.apex script.py [args]`` (or ``-m module [args]``): runs
an unmodified Apex training script with Apex's imports served by core_ops."""

import re
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
    if head == 1:
        ranks = _in_the_scripts_spelling(argv[0], ranks)
    return argv[:head] + ranks + argv[head:]


def _in_the_scripts_spelling(script, ranks):
    """torch.distributed.launch passed ``--local_rank`` until torch 2.0 and
    ``--local-rank`` since; Apex-era scripts declare the old spelling only, and argparse
    takes no other. The rank goes in the spelling the script declares."""
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            source = f.read()
    except OSError:
        return ranks
    if "--local-rank" in source or not re.search(r"['\"]--local_rank['\"]", source):
        return ranks
    return [r.replace("--local-rank", "--local_rank", 1) if r.startswith("--local-rank") else r for r in ranks]


def main(argv):
    argv = _script_first(list(argv))
    if argv and argv[0] not in ("-h", "--help"):
        install()
        export_to_children()
    return run(argv, USAGE, "core_ops.compat.apex")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
