"""The CPU runtime's start-up hook: `SGLANG_USE_CPU_ENGINE=1 python -m sglang.launch_server ...`
(or any SGLang tool) runs on a CPU-only machine as it is.

Installed as `sglang_cpu_startup.pth` (setup.py), a line Python runs at start-up (silent where
this module cannot be found: an editable install whose checkout is gone). Only where
`SGLANG_USE_CPU_ENGINE=1` (SGLang's own switch for its CPU engine) it puts a finder first on
`sys.meta_path` that imports nothing until `sglang` is imported; then, before the package
executes, it leaves and calls `sglang_cpu.enable()` (the torch stand-ins for `sgl_kernel` and
`torchvision` on the import path of this process and its children; nothing where CUDA is
available). Not at start-up itself: `enable()` imports torch and probes the real packages in
child interpreters, which would run this hook again. A failure is logged, never raised.
"""

from __future__ import annotations

import os
import sys

CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"


class EnableBeforeSGLang:
    """Meta-path finder: at the first `import sglang`, enable the runtime, then step aside."""

    def find_spec(self, name, path=None, target=None):
        if name != "sglang":
            return None
        sys.meta_path.remove(self)
        try:
            import sglang_cpu

            sglang_cpu.enable()
        except Exception:
            import logging

            logging.getLogger(__name__).exception("sglang_cpu start-up hook: sglang_cpu.enable() failed")
        return None  # the usual finders load sglang


def install() -> None:
    """What the .pth calls: the finder, once per process, where SGLang's CPU engine is asked for."""
    wanted = os.environ.get(CPU_ENGINE_ENV) == "1" and "sglang" not in sys.modules
    if wanted and not any(isinstance(finder, EnableBeforeSGLang) for finder in sys.meta_path):
        sys.meta_path.insert(0, EnableBeforeSGLang())
