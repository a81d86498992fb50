"""The verify window's layout: `build_verify_layout` turns a batch of `VerifyRequest`s into rows,
positions, KV indices and the custom mask in SGLang's QLEN_ONLY and FULL forms (layout.py), and
the window's shape and mask buffer (window.py)."""

from .layout import VerifyLayout, VerifyRequest, build_verify_layout, expand_qlen_only_mask

__all__ = ["VerifyLayout", "VerifyRequest", "build_verify_layout", "expand_qlen_only_mask"]
