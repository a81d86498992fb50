"""`sgl_kernel.speculative` stand-in: the NGRAM tree-mask reconstruction op."""

from sglang_cpu.tree_ops import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
