"""`python -m sglang_cpu.launch_server <sglang.launch_server arguments>`.

Enables the CPU runtime (`sglang_cpu.enable()`: only where no CUDA device is present) and then
runs SGLang's own `sglang.launch_server`. Where the runtime is on, it adds what serving on a CPU
needs and the user did not set (`cpu_defaults`): `--device cpu --attention-backend torch_native
--disable-cuda-graph --sleep-on-idle` and `--dtype bfloat16` where the CPU has AVX512-BF16 or AMX
(else `float32`: a bf16 matmul without them runs several times slower). A flag given wins. The
PARSE plugin itself is loaded by SGLang through its entry point, so on a GPU machine this is the
same as `python -m sglang.launch_server`.
"""

from __future__ import annotations

import logging
import runpy
import sys
from pathlib import Path

import sglang_cpu as cpu

logger = logging.getLogger(__name__)


def has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """The CPU multiplies bf16 natively (its flags name avx512_bf16 or amx_bf16); cpuinfo: the text
    of /proc/cpuinfo (None: read it; unreadable: no)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set(cpuinfo.split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def cpu_defaults(args: list[str], fast_bf16: bool) -> list[str]:
    """`args` with each of `CPU_ENGINE_SETTINGS` the user did not give appended as a flag, its
    dtype bfloat16 where `fast_bf16`, else float32 (module docstring)."""
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    settings = {**cpu.CPU_ENGINE_SETTINGS, "dtype": "bfloat16" if fast_bf16 else "float32"}
    added = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if flag not in given:
            added += [flag] if value is True else [flag, str(value)]
    return args + added


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    # Until SGLang configures logging (after loading plugins), show what enable() and the
    # plugin's register() log in this process.
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    if cpu.enable().active:
        added = cpu_defaults(args, has_fast_bf16())[len(args) :]
        if added:
            logger.info("sglang_cpu.launch_server adds the CPU's settings: %s", " ".join(added))
        args += added
    sys.argv = ["sglang.launch_server", *args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
