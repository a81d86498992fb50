"""Each CPU rank on the cores `SGLANG_CPU_OMP_THREADS_BIND` names, on any CPU.

What it changes: AROUND `sglang.srt.distributed.bootstrap._init_cpu_threads_env` (every
scheduler process of a CPU server, before its model loads). Where SGLang binds the rank itself
(sgl_kernel's `init_cpu_threads_env`, on CPUs with AMX and on arm64), nothing. Elsewhere the
process is pinned to its rank's cores (`os.sched_setaffinity`) and torch's thread pool sized to
them.

Why: elsewhere SGLang only warns that binding is disabled, and every rank keeps torch's default
pool of one thread per core of the machine. Two data-parallel replicas on the 2-core CI machine
then run four busy threads on two cores; measured with benchmarks/replicas.py, they served
0.06-0.12x the tokens/s of one replica. TP ranks share the same fate.
"""

from __future__ import annotations

import logging
import os

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

logger = logging.getLogger(__name__)

TARGET = "sglang.srt.distributed.bootstrap._init_cpu_threads_env"
HOOKED_SIGNATURES = {
    TARGET: "(*, local_omp_cpuid: Optional[List[int]], dist_init_method: Optional[str] = None) -> None"
}


def cores_of(spec: str) -> list[int]:
    """'0', '0-3', '0,2,4-5' (SGLang's bind syntax) -> the core ids."""
    cores: list[int] = []
    for part in str(spec).split(","):
        low, _, high = part.strip().partition("-")
        cores += range(int(low), int(high or low) + 1)
    return cores


def bind_threads(original, *, local_omp_cpuid, dist_init_method=None):
    """AROUND _init_cpu_threads_env: SGLang's own binding where it has one, else ours."""
    from sglang.srt.distributed import bootstrap

    if bootstrap._is_cpu_amx_available or bootstrap._is_cpu_arm64 or not local_omp_cpuid:
        return original(local_omp_cpuid=local_omp_cpuid, dist_init_method=dist_init_method)
    import torch

    cores = cores_of(local_omp_cpuid)
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    logger.info("sglang_cpu: this rank runs on cores %s, %d torch thread(s)", cores, len(cores))


def install() -> str:
    register_hooks_once(__name__, (TARGET, bind_threads, HookType.AROUND))
    return f"{TARGET}: each CPU rank pinned to its SGLANG_CPU_OMP_THREADS_BIND cores"
