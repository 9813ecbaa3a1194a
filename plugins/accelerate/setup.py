"""The wheel carries core-ops-accelerate-autoload.pth at the top of site-packages, which
loads the plugin when the framework is imported (Note [Plugin autoload] in
core_ops_autoload.py). An editable install cannot carry it: tools/setup.sh puts it in
place for the development environment."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "core-ops-accelerate-autoload.pth"


class BuildWithAutoload(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithAutoload})
