"""Stand-in for `sgl_kernel` on CPU-only machines: torch versions of the CPU ops SGLang calls.

Put on the import path by `sglang_cpu.enable()` only when CUDA is absent and no
working `sgl_kernel` is installed, so a real one (GPU machines, CPU builds) is never
shadowed. Names not provided here stay missing (ImportError / AttributeError), so
SGLang's own feature probes see an absent kernel.

Like the real package it registers its torch op on import: `torch.ops.sgl_kernel.murmur_hash32_cpu`,
which SGLang's `murmur_hash32` calls on CPU tensors (seeded sampling and verify coins).
"""

from sglang_cpu.cache_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
)
from sglang_cpu.sampling_ops import register_murmur_hash32_op
from sglang_cpu.spec_ops import (
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
)
from sglang_cpu.tree_ops import build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu

from . import speculative

register_murmur_hash32_op()

__version__ = "0.0.0+parse.standin"
PARSE_STANDIN = True

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "speculative",
    "verify_tree_greedy_cpu",
]
