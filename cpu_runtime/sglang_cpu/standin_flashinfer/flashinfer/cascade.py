"""`flashinfer.cascade` stand-in: `merge_state` (base-2 log-sum-exp, as FlashInfer)."""

from sglang_cpu.flashinfer_ops import merge_state

__all__ = ["merge_state"]
