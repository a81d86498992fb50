"""`flashinfer.decode` stand-in: the paged decode wrapper and `fast_decode_plan`."""

from sglang_cpu.flashinfer_ops import BatchDecodeWithPagedKVCacheWrapper, fast_decode_plan

__all__ = ["BatchDecodeWithPagedKVCacheWrapper", "fast_decode_plan"]
