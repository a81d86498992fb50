"""`flashinfer.prefill` stand-in: the paged and ragged prefill wrappers."""

from sglang_cpu.flashinfer_ops import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

__all__ = ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"]
