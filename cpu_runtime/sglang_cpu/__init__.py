"""CPU runtime: lets stock SGLang 0.5.23 run on a machine without CUDA.

SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`) still imports `sgl_kernel` (for a handful
of CPU ops) and `torchvision` (module-level imports in multimodal code), and neither
registry wheel loads next to torch+cpu. `enable()` puts torch stand-ins for the missing
ones on the import path of this process *and* of every process SGLang spawns (scheduler,
detokenizer: via PYTHONPATH), and sets `SGLANG_USE_CPU_ENGINE=1` (and `TORCH_COMPILE_DISABLE=1`:
SGLang's torch.compile'd helpers run eagerly, not recompiled mid-serving). Nothing happens until
it is called (or `python -m sglang_cpu.launch_server` calls it), and it does nothing
where CUDA is available. Call it before importing SGLang's runtime modules, which read
the CPU flag once at import.

The runtime also patches SGLang where its GPU path needs what only a GPU has (`PATCHES`,
each a module of this package saying what it changes): the plugin installs them in every
SGLang process where the runtime is on (`patches()`), and nowhere else.

Opt-in, for tests: `enable_flashinfer_standin()` adds a torch stand-in of `flashinfer`, so
that an engine started with `attention_backend="flashinfer"` runs SGLang's real FlashInfer
backend on CPU (see `enable_flashinfer_standin`); `disable_flashinfer_standin()` takes it off.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
# module name -> folder that holds its stand-in package
STANDIN_DIRS = {
    "sgl_kernel": str(_HERE / "standin_sgl_kernel"),
    "torchvision": str(_HERE / "standin_torchvision"),
}
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
# Set (to "1") in the environment an engine's processes start with: SGLang's GPU graph
# runners run on CPU with the eager-replay stand-in (sglang_cpu/cpu_graphs.py).
# For tests of the GPU graph path; an engine also needs decode graphs left on.
CPU_GRAPHS_ENV = "PARSE_CPU_GRAPHS"
# Set (to "1") by enable() for its process and children: SGLang's torch.compile'd helpers (the
# draft chain's `select_top_k_tokens`, among others) run eagerly. On CPU, dynamo compiles them
# on first use and again for the next new batch size, 0.2-2 s each time mid-serving (a GPU
# captures them in its graphs at start-up instead); eager they cost microseconds.
TORCH_COMPILE_DISABLE_ENV = "TORCH_COMPILE_DISABLE"
# SGLang's per-rank core lists, '|'-separated ("0|1": rank or replica 0 on core 0, 1 on core 1);
# applied by sglang_cpu/threads_binding.py where SGLang itself does not.
CPU_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
# Opt-in only, never installed by enable(): see enable_flashinfer_standin.
FLASHINFER_STANDIN_DIR = str(_HERE / "standin_flashinfer")
# SGLang's switch for its kernel-package version checks: with attention_backend="flashinfer"
# it asserts the flashinfer_python distribution >= 0.7.2, which the stand-in is not.
SKIP_KERNEL_VERSION_CHECK_ENV = "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"
_env_before_standin: dict[str, str | None] = {}

# The runtime's patches of SGLang (HOOKED_SIGNATURES + install(), as the plugin's own).
PATCHES = [
    "sglang_cpu.torch_native_verify",  # verify and draft-extend modes for the torch_native backend
    "sglang_cpu.torch_native_draft",  # its multi-step draft backend
    "sglang_cpu.cpu_graphs",  # SGLang's graph runners on CPU: inert unless CPU_GRAPHS_ENV asks
    "sglang_cpu.sampling_patch",  # SGLang's sampling verification (eagle_sample) on CPU
    "sglang_cpu.threads_binding",  # each rank (TP, DP replica) on its SGLANG_CPU_OMP_THREADS_BIND cores
    "sglang_cpu.pd_transfer",  # prefill/decode KV transfer with mooncake over TCP
]
FLASHINFER_PATCH = "sglang_cpu.flashinfer_on_cpu"  # where the FlashInfer stand-in is imported


@dataclasses.dataclass(frozen=True)
class CpuRuntimeStatus:
    """What `enable()` did: whether the CPU runtime is active, which stand-ins it put on the path, and why."""

    active: bool
    standins: tuple[str, ...]
    reason: str


_status: CpuRuntimeStatus | None = None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _real_module_works(name: str) -> bool:
    """True if an installed `name` (outside our stand-in folders) imports cleanly.

    Probed in a subprocess: a CUDA-linked wheel can fail with a loader error, and a
    failed import must not leave half a module behind in this process.
    """
    ours = set(STANDIN_DIRS.values())
    search = [p for p in sys.path if p not in ours]
    if importlib.machinery.PathFinder.find_spec(name, search) is None:
        return False
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in search if p)
    probe = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, capture_output=True, timeout=300)
    return probe.returncode == 0


def _prepend_import_path(folder: str) -> None:
    """Put folder first on sys.path and PYTHONPATH (inherited by spawned processes)."""
    if folder not in sys.path:
        sys.path.insert(0, folder)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *parts])


def _remove_import_path(folder: str) -> None:
    """Undo _prepend_import_path."""
    while folder in sys.path:
        sys.path.remove(folder)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != folder]
    if parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        os.environ.pop("PYTHONPATH", None)


def enable() -> CpuRuntimeStatus:
    """Activate the CPU runtime for this process and its SGLang children; idempotent.

    Inactive (returns active=False, changes nothing) when CUDA is available. Otherwise
    sets SGLANG_USE_CPU_ENGINE=1 and TORCH_COMPILE_DISABLE=1 (torch.compile runs eagerly) and
    installs the stand-in for each of `sgl_kernel` and `torchvision` that is not already
    importable for real.
    """
    global _status
    if _status is not None:
        return _status
    if _cuda_available():
        _status = CpuRuntimeStatus(False, (), "CUDA is available: stock SGLang runs unchanged")
        logger.info("sglang_cpu: not enabled (%s)", _status.reason)
        return _status
    installed = []
    for name, folder in STANDIN_DIRS.items():
        if name in sys.modules or _real_module_works(name):
            logger.info("sglang_cpu: keeping the installed %s", name)
            continue
        _prepend_import_path(folder)
        installed.append(name)
    os.environ[CPU_ENGINE_ENV] = "1"
    os.environ[TORCH_COMPILE_DISABLE_ENV] = "1"
    if "torch._dynamo.config" in sys.modules:  # read at import: this process may have imported it already
        sys.modules["torch._dynamo.config"].disable = True
    _status = CpuRuntimeStatus(True, tuple(installed), "no CUDA device")
    logger.info(
        "sglang_cpu: enabled (%s): %s=1, %s=1, stand-ins on sys.path and PYTHONPATH: %s",
        _status.reason,
        CPU_ENGINE_ENV,
        TORCH_COMPILE_DISABLE_ENV,
        ", ".join(f"{n} ({STANDIN_DIRS[n]})" for n in installed) or "none",
    )
    return _status


# What SGLang needs to serve on a CPU (docs/cpu-runtime.md): its CPU device, the torch-native
# attention backend (the one our verify patch extends), no CUDA graphs, fp32 (bf16 on CPU
# diverges from the reference models), and an idle scheduler that waits for requests: without
# --sleep-on-idle it polls, 94% of a core per idle server (measured with top), which every
# other server and engine on the machine then runs without.
CPU_ENGINE_SETTINGS = dict(
    device="cpu", attention_backend="torch_native", disable_cuda_graph=True, dtype="float32", sleep_on_idle=True
)


def runtime_active() -> bool:
    """Whether this process runs SGLang on the CPU runtime: SGLANG_USE_CPU_ENGINE=1 (which
    `enable()` sets for its processes) and no CUDA device."""
    return os.environ.get(CPU_ENGINE_ENV) == "1" and not _cuda_available()


def patches() -> list[str]:
    """The runtime's patch modules this process needs (none where the runtime is off)."""
    if not runtime_active():
        return []
    return PATCHES + ([FLASHINFER_PATCH] if flashinfer_standin_active() else [])


def graphs_requested() -> bool:
    """Whether this process runs SGLang's graph runners with the eager-replay stand-in."""
    return os.environ.get(CPU_GRAPHS_ENV) == "1" and not _cuda_available()


def engine_settings() -> dict:
    """`sglang.Engine` keyword arguments this machine needs: enables the CPU runtime and
    returns CPU_ENGINE_SETTINGS where there is no CUDA device, {} otherwise."""
    return dict(CPU_ENGINE_SETTINGS) if enable().active else {}


def flashinfer_standin_active() -> bool:
    """True when `import flashinfer` in this process loads the stand-in (it is on the import
    path, or already imported). `parse_sglang.plugin` installs the FlashInfer-on-CPU patch of
    SGLang (sglang_cpu/flashinfer_on_cpu.py) in exactly those processes."""
    spec = importlib.util.find_spec("flashinfer")
    return spec is not None and (spec.origin or "").startswith(FLASHINFER_STANDIN_DIR)


def enable_flashinfer_standin() -> CpuRuntimeStatus:
    """Put the torch stand-in of `flashinfer` first on the import path of this process and of
    the SGLang processes it starts from now on (sys.path and PYTHONPATH), after `enable()`, and
    set SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (SGLang otherwise asserts the flashinfer_python
    distribution's version when an engine uses attention_backend="flashinfer").

    Opt-in, for tests: an `sglang.Engine` started with `attention_backend="flashinfer"` then
    runs SGLang's own FlashInfer backend (its plan / run calls, index updaters, verify and
    draft metadata) with torch kernels (sglang_cpu.flashinfer_ops, triton_ops), and the
    plugin installs sglang_cpu/flashinfer_on_cpu.py in its processes. Engines with
    other attention backends are unaffected. Inactive (changes nothing) where CUDA is
    available: a GPU machine runs the real FlashInfer. Idempotent.
    """
    status = enable()
    if not status.active:
        return CpuRuntimeStatus(False, (), status.reason)
    loaded = sys.modules.get("flashinfer")
    if loaded is not None and not getattr(loaded, "PARSE_STANDIN", False):
        raise RuntimeError(
            f"flashinfer is already imported from {getattr(loaded, '__file__', '?')}; "
            "enable_flashinfer_standin() must run before anything imports it"
        )
    _prepend_import_path(FLASHINFER_STANDIN_DIR)
    _env_before_standin.setdefault(SKIP_KERNEL_VERSION_CHECK_ENV, os.environ.get(SKIP_KERNEL_VERSION_CHECK_ENV))
    os.environ[SKIP_KERNEL_VERSION_CHECK_ENV] = "1"
    logger.info(
        "sglang_cpu: FlashInfer stand-in on sys.path and PYTHONPATH (%s), %s=1",
        FLASHINFER_STANDIN_DIR,
        SKIP_KERNEL_VERSION_CHECK_ENV,
    )
    return CpuRuntimeStatus(True, ("flashinfer",), "opt-in FlashInfer stand-in on a CPU-only machine")


def disable_flashinfer_standin() -> None:
    """Take the stand-in off the import path and forget its imported modules, so that later
    imports (and processes started later) see no `flashinfer`, as before. SGLang processes
    already started with it keep it; the patch it brought into this process is undone."""
    _remove_import_path(FLASHINFER_STANDIN_DIR)
    for name, value in _env_before_standin.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _env_before_standin.clear()
    patch = sys.modules.get(FLASHINFER_PATCH)
    if patch is not None:
        patch.uninstall()
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        if getattr(sys.modules[name], "__file__", "").startswith(FLASHINFER_STANDIN_DIR):
            del sys.modules[name]
