"""`python -m sglang_cpu.launch_server <sglang.launch_server arguments>`.

Enables the CPU runtime (`sglang_cpu.enable()`: only where no CUDA device is
present) and then runs SGLang's own `sglang.launch_server` with the same arguments,
adding none. The PARSE plugin itself is loaded by SGLang through its entry point, so on a
GPU machine this is the same as `python -m sglang.launch_server`.
"""

from __future__ import annotations

import logging
import runpy
import sys

import sglang_cpu as cpu


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    # Until SGLang configures logging (after loading plugins), show what enable() and the
    # plugin's register() log in this process.
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    cpu.enable()
    sys.argv = ["sglang.launch_server", *args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
