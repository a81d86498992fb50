"""PARSE: parallel prefix verification for speculative generation, for SGLang."""

__version__ = "0.1.0"


def cpu_engine_settings() -> dict:
    """`sglang.Engine` settings on a machine without CUDA, from the CPU runtime (the separate
    `sglang-cpu-runtime` distribution in this repository's cpu_runtime/, which the plug-in
    itself never imports): what the demo and the profiler run with there."""
    try:
        import sglang_cpu
    except ImportError as err:
        raise RuntimeError(
            "no CUDA device and no CPU runtime: install it with `bash scripts/setup.sh` "
            "(or `pip install -e cpu_runtime`) to run SGLang on this machine's CPU"
        ) from err
    return sglang_cpu.engine_settings()
