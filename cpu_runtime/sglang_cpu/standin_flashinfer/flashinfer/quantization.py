"""`flashinfer.quantization` stand-in: `packbits` / `segment_packbits` (default bitorder "big", as FlashInfer)."""

from sglang_cpu.flashinfer_ops import packbits, segment_packbits

__all__ = ["packbits", "segment_packbits"]
