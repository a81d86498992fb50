"""`flashinfer.prefill` stand-in: the paged and ragged prefill wrappers."""

from parse_sglang.cpu.flashinfer_ops import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

__all__ = ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"]
