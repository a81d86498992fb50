"""The verify window through FlashInfer's paged prefill kernel (GPU), as SGLang drives it.

SGLang's FlashInfer backend plans `BatchPrefillWithPagedKVCacheWrapper` once per
TARGET_VERIFY batch (page size 1, NHD, the FULL custom mask) and runs it once per layer.
This runner does the same from a `VerifyLayout`, so the GPU tier can check that the kernel
and `paged_prefill_attention` agree on identical metadata. flashinfer is imported inside
the methods: the module imports on machines without it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layout import VerifyLayout
from .packbits import segment_packbits

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace


class FlashInferPagedPrefill:
    """Plan once per batch, run once per layer; k/v caches are [num_slots, Hk, D] (page size 1)."""

    def __init__(self, device: str | torch.device = "cuda", workspace_bytes: int = WORKSPACE_BYTES):
        import flashinfer

        self.device = torch.device(device)
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=self.device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")

    def plan(
        self,
        qo_indptr: Tensor,
        kv_indptr: Tensor,
        kv_indices: Tensor,
        *,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        custom_mask: Tensor | None = None,
        packed_custom_mask: Tensor | None = None,
        causal: bool = False,
        sm_scale: float | None = None,
    ) -> None:
        """FlashInfer's plan with page size 1 (every last page holds one token)."""
        batch = len(qo_indptr) - 1
        self.wrapper.plan(
            qo_indptr.to(self.device, torch.int32),
            kv_indptr.to(self.device, torch.int32),
            kv_indices.to(self.device, torch.int32),
            torch.ones(batch, dtype=torch.int32, device=self.device),
            num_qo_heads,
            num_kv_heads,
            head_dim,
            1,
            custom_mask=None if custom_mask is None else custom_mask.to(self.device),
            packed_custom_mask=None if packed_custom_mask is None else packed_custom_mask.to(self.device),
            causal=causal,
            sm_scale=sm_scale,
            q_data_type=dtype,
            kv_data_type=dtype,
        )

    def plan_verify(
        self,
        layout: VerifyLayout,
        *,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float | None = None,
        prepack_mask: bool = False,
    ) -> None:
        """Plan a verify batch with its FULL mask; prepack_mask packs it here (our packbits) instead of in FlashInfer."""
        if prepack_mask:
            packed, _ = segment_packbits(layout.mask_full, layout.mask_full_indptr)
            masks = {"packed_custom_mask": packed}
        else:
            masks = {"custom_mask": layout.mask_full}
        self.plan(
            layout.qo_indptr,
            layout.kv_indptr,
            layout.kv_indices,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            sm_scale=sm_scale,
            **masks,
        )

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """q [R, Hq, D] -> [R, Hq, D]."""
        return self.wrapper.run(q, (k_cache, v_cache))
