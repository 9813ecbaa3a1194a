"""The wheel carries core-ops-apex-alias.pth at the top of site-packages, which installs
the alias's finder at start-up (Note [An alias that never shadows Apex] in
core_ops_apex_alias.py); the build refuses an environment where an ``apex``
distribution is installed."""

import importlib.metadata
import os
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "core-ops-apex-alias.pth"


def installed_apex():
    """The ``apex`` distribution in the environment being installed into, or None.
    pip builds in an environment whose sys.path hides the target's site-packages, but
    with the target's interpreter: its own site-packages are searched too."""
    paths = dict.fromkeys(sys.path + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    return next(iter(importlib.metadata.distributions(name="apex", path=list(paths))), None)


class BuildRefusingApex(build_py):
    def run(self):
        apex = installed_apex()
        if apex is not None:
            where = apex.locate_file("")
            sys.exit(f"core-ops-apex-alias: refusing to install: a distribution named apex "
                     f"({apex.version}, in {where}) is installed in this environment, and the alias "
                     "would stand in for it. Keep that Apex and go without the alias (run a script on "
                     "core-ops with `python -m core_ops.compat.apex script.py`), or `pip uninstall apex` "
                     "first (PyPI's `apex` is not NVIDIA's Apex either).")
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildRefusingApex})
