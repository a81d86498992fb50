"""Verify-window layout and custom-mask paged attention (torch-native and FlashInfer).

- layout: `build_verify_layout` turns a batch of `VerifyRequest`s into rows, positions,
  KV indices and the custom mask in SGLang's QLEN_ONLY and FULL forms.
- paged: `paged_prefill_attention`, FlashInfer's paged prefill semantics in torch (CPU).
- packbits: FlashInfer's mask bit packing.
- flashinfer_verify: the same layout through FlashInfer on a GPU (imports flashinfer lazily).
"""

from .layout import VerifyLayout, VerifyRequest, build_verify_layout, expand_qlen_only_mask
from .packbits import packbits, segment_packbits, unpack_segments, unpackbits
from .paged import paged_prefill_attention

__all__ = [
    "VerifyLayout",
    "VerifyRequest",
    "build_verify_layout",
    "expand_qlen_only_mask",
    "packbits",
    "paged_prefill_attention",
    "segment_packbits",
    "unpack_segments",
    "unpackbits",
]
