"""Running ``script.py [args]`` or ``-m module [args]`` as ``python`` would, for the
``python -m <tool> ...`` wrappers (core_ops.compat.apex, core_ops_accelerate) that set
something up first."""

import contextlib
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
        with _ending_the_process_group():
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"{prog}: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` does
    with _ending_the_process_group():
        runpy.run_path(script, run_name="__main__")
    return 0


@contextlib.contextmanager
def _ending_the_process_group():
    """Destroys the default process group a script leaves behind when it ends well.
    Apex-era scripts never call destroy_process_group (torch documented it in 2.3); torch
    then drops the group while the interpreter shuts down, where gloo's worker threads can
    abort the process ("terminate called without an active exception", SIGABRT: pytorch
    #190489), so a launcher reports a finished run as failed. A script that raised keeps
    its group: its peers may still be inside a collective with it."""
    try:
        yield
    except SystemExit as e:
        if e.code in (0, None):
            _destroy_default_group()
        raise
    _destroy_default_group()


def _destroy_default_group():
    dist = sys.modules.get("torch.distributed")  # not imported: the script used none
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
