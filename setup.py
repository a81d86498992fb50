"""Ships `parse_sglang_startup.pth` next to the package, in regular and in editable installs
(the start-up hook: parse_sglang_startup.py says what it does and why). Everything else about
the package is in pyproject.toml.

A wheel puts the files at its root into site-packages, where Python reads .pth files at
start-up. A regular build copies `build_lib` into the wheel; an editable build (PEP 660,
setuptools' `editable_wheel`) does not (it maps the sources instead), so there the file goes
straight to the editable wheel's root, which that build makes the install target
(`install_lib`). Either way pip lists the file in the installation's RECORD, and
`pip uninstall` removes it.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "parse_sglang_startup.pth"


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        self.copy_file(str(Path(__file__).parent / PTH), str(Path(target) / PTH), preserve_mode=0)


setup(cmdclass={"build_py": build_py_with_pth})
