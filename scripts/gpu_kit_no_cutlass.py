"""For the GPU kit only (../shared/gpu-kit), run on the GPU machine after its install.sh.

SGLang 0.5.23 builds every Llama / Qwen2 / Qwen3 MLP with `DualGemm`, whose mode check imports
`sglang.kernels.ops.gemm.cutedsl_dual_gemm`, which imports `cutlass` (nvidia-cutlass-dsl, a
dependency of sglang that the kit's bundle does not carry): without it no model loads
("No module named 'cutlass'"). The kernel is Blackwell-only (`can_use_dual_gemm` requires SM100),
so on Hopper the answer is always "no dual GEMM"; this replaces the module with one that gives
that answer without cutlass, and refuses on SM100. A stock `pip install sglang==0.5.23` has
nvidia-cutlass-dsl and needs none of this.

    GPUCHECK_INSTALL="bash .gpu-bundle/install.sh .gpu-bundle && python3 scripts/gpu_kit_no_cutlass.py" \
      bash .gpu-bundle/check.sh .gpu-bundle 540
"""

import importlib.util
import os

root = importlib.util.find_spec("sglang").submodule_search_locations[0]
path = os.path.join(root, "kernels", "ops", "gemm", "cutedsl_dual_gemm.py")
SRC = '''"""gpu-kit stand-in (no nvidia-cutlass-dsl): the SM100 dual GEMM is never chosen."""
from enum import IntEnum

MAX_DUAL_GEMM_DECODE_TOKENS = 16


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4


def can_use_dual_gemm(num_tokens, hidden_size, intermediate_size, quant_mode):
    from sglang.srt.utils import is_sm100_supported
    if is_sm100_supported():
        raise RuntimeError("gpu-kit: SM100 needs nvidia-cutlass-dsl for the dual GEMM")
    return False


def dual_gemm_swiglu(*args, **kwargs):
    raise RuntimeError("gpu-kit stand-in: dual_gemm_swiglu needs nvidia-cutlass-dsl")


dual_gemm_swiglu_fp8 = dual_gemm_swiglu
'''
with open(path, "w") as f:
    f.write(SRC)
print("gpu-kit: cutedsl_dual_gemm replaced by a no-cutlass stand-in at", path)
