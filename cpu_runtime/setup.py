"""Ships `sglang_cpu_startup.pth` next to the package in regular and editable installs, the way
the repository root's setup.py ships the plug-in's hook (its docstring says why this way)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        editable = getattr(self, "editable_mode", False)
        folder = self.get_finalized_command("install").install_lib if editable else self.build_lib
        hook = Path(__file__).with_name("sglang_cpu_startup.pth")
        self.copy_file(str(hook), str(Path(folder) / hook.name), preserve_mode=0)


setup(cmdclass={"build_py": BuildPyWithStartupHook})
