"""What SGLang's TARGET_VERIFY forward and its sampler read from a PARSE round.

`ParseVerifyInput` is the batch's `spec_info` during the one target forward over every
request's window (chain rows c_n, d_1..d_L, then K probe blocks of m rows), all of one
`WindowShape` (SGLang needs the same number of rows N for every request of a batch). Its
tensors are built on the device (`attention.window`): nothing that grows with the context
crosses from the host. `for_capture` is the stand-in SGLang's decode CUDA-graph runner
captures with.

The window's per-shape constants (its logits rows, the chain as `eagle_sample`'s tree) are
`attention.window.ShapeConstants`.
"""

from __future__ import annotations

import enum
from typing import Optional

import torch
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind, KVLocPlan
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.spec_info import SpecInput

from parse_sglang.attention.layout import indptr_of
from parse_sglang.attention.window import FullMaskBuffer, WindowShape, full_mask, window_inputs


class ParseInputType(enum.Enum):
    """PARSE's own `spec_input_type` (SGLang's `SpecInputType` is a closed enum whose members
    name other algorithms): SGLang code that compares it with theirs sees no match, and the
    phase guards SGLang dispatches on (`is_verify_input` / `is_draft_input`) are answered by
    `ParseVerifyInput` itself."""

    PARSE_VERIFY = "parse_verify"


class ParseVerifyInput(SpecInput):
    """spec_info of a PARSE TARGET_VERIFY forward.

    custom_mask is in the form the process's attention backend reads in `forward_batch`:
    QLEN_ONLY (N x N per request) on CPU, FULL (N x (P + N) per request, in the worker's
    `FullMaskBuffer`) on GPU (Triton reads it directly); `generate_attn_arg_prefill`
    (FlashInfer's entry) always hands out FULL. logits_row_index: the rows whose logits PARSE
    reads, request-major, from `ShapeConstants`; scheduler_patches/logits_rows.py prunes the
    rest before the lm_head.
    """

    def __init__(
        self,
        shape: WindowShape,
        *,
        logits_rows: torch.Tensor,
        input_ids: Optional[torch.Tensor],
        positions: Optional[torch.Tensor],
        custom_mask: torch.Tensor,
        mask_qlen_only: Optional[torch.Tensor],
        prefix_lens: Optional[torch.Tensor],
        prefix_sum: int,
        device: torch.device,
        mask_buffer: Optional[FullMaskBuffer] = None,
    ):
        super().__init__(ParseInputType.PARSE_VERIFY)
        self.shape = shape
        self.draft_token_num = shape.rows
        self.num_tokens_per_req = shape.rows
        self.num_tokens_for_logprob_per_req = shape.rows
        self.input_ids = input_ids
        self.positions = positions
        self.custom_mask = custom_mask
        self.mask_qlen_only = mask_qlen_only
        self.prefix_lens = prefix_lens
        self.prefix_sum = prefix_sum
        self.logits_row_index = logits_rows
        self.mask_buffer = mask_buffer  # the FULL buffer custom_mask is a view of (None: not one)
        self.capture_hidden_mode = CaptureHiddenMode.NULL
        self.device = device

    def is_verify_input(self) -> bool:
        return True

    def is_draft_input(self) -> bool:
        return False

    @classmethod
    def for_round(
        cls,
        shape: WindowShape,
        *,
        prefix_lens: torch.Tensor,
        prefix_sum: int,
        chain_tokens: torch.Tensor,
        boundaries: torch.Tensor,
        suffix_ids: Optional[torch.Tensor],
        logits_rows: torch.Tensor,
        mask_buffer: Optional[FullMaskBuffer],
    ) -> "ParseVerifyInput":
        """The verify input of one round: prefix_lens [bs] (P), prefix_sum = sum(P) (host int),
        chain_tokens [bs, L+1], boundaries [bs, K] of the window's probes, suffix_ids [m]
        (None without probes), all on the device; mask_buffer: the FULL-form buffer, or None
        for the QLEN_ONLY form."""
        device = chain_tokens.device
        suffix = suffix_ids if suffix_ids is not None else torch.zeros(0, dtype=torch.int64, device=device)
        input_ids, positions, mask = window_inputs(shape, prefix_lens, chain_tokens, boundaries, suffix)
        custom_mask = mask_buffer.write(mask, shape.rows, prefix_lens, prefix_sum) if mask_buffer is not None else mask
        return cls(
            shape,
            logits_rows=logits_rows,
            input_ids=input_ids,
            positions=positions,
            custom_mask=custom_mask,
            mask_qlen_only=mask,
            prefix_lens=prefix_lens,
            prefix_sum=prefix_sum,
            device=device,
            mask_buffer=mask_buffer,
        )

    @classmethod
    def for_capture(
        cls, shape: WindowShape, logits_rows: torch.Tensor, custom_mask: torch.Tensor
    ) -> "ParseVerifyInput":
        """What SGLang's decode CUDA-graph runner captures a PARSE verify with (its
        `get_spec_info` / `create_dummy_verify_input`): the runner's own all-True mask
        buffer and this shape's logits rows from `ShapeConstants` (the graph bakes them in,
        and they outlive it); token ids and positions come from the runner's buffers."""
        return cls(
            shape,
            logits_rows=logits_rows,
            input_ids=None,
            positions=None,
            custom_mask=custom_mask,
            mask_qlen_only=None,
            prefix_lens=None,
            prefix_sum=0,
            device=custom_mask.device,
        )

    @property
    def tree_topk(self) -> int:
        # Not a topk tree: backends that switch on it (intel_amx) must read the mask.
        return -1

    def generate_attn_arg_prefill(
        self,
        *,
        req_pool_indices: torch.Tensor,
        paged_kernel_lens: torch.Tensor,
        paged_kernel_lens_sum: int,
        translator: KVIndexTranslator,
        plan: KVLocPlan,
        kind: IdSpaceKind = IdSpaceKind.FULL,
    ):
        """(kv_indices, kv_indptr, qo_indptr, FULL custom mask) for a paged prefill kernel.

        paged_kernel_lens are the committed lengths P; each request reads P + N slots, its
        window being req_to_token[P : P + N], the slots the window rows were written to.
        A CUDA-graph replay pads the batch (entries past this round's requests): their
        mask is all True, as SGLang's EAGLE pads its own — the FULL buffer holds True past
        the round's mask, and the capture input's mask is the runner's all-True buffer.
        """
        bs = req_pool_indices.numel()
        window = self.draft_token_num
        kv_lens = paged_kernel_lens + window
        kv_indptr = indptr_of(kv_lens, torch.int32)
        qo_indptr = torch.arange(bs + 1, dtype=torch.int32, device=self.device) * window
        kv_indices = torch.empty(paged_kernel_lens_sum + window * bs, dtype=torch.int32, device=self.device)
        translator.pack_read_stream(
            plan,
            req_pool_indices=req_pool_indices,
            seq_lens=kv_lens,
            indptr=kv_indptr,
            out=kv_indices,
            kind=kind,
            num_token_blocks=None,
            kv_lens_sum=paged_kernel_lens_sum,
        )
        mask = self.custom_mask
        if self.mask_qlen_only is not None and mask is self.mask_qlen_only:  # QLEN_ONLY form (CPU)
            mask = full_mask(mask, window, self.prefix_lens, self.prefix_sum)
        needed = window * paged_kernel_lens_sum + window * window * bs
        if mask.numel() < needed:  # a padded graph batch
            if self.mask_buffer is not None:  # the FULL buffer holds True past the round's mask
                mask = self.mask_buffer.buffer[:needed]
            else:
                mask = torch.cat([mask, torch.ones(needed - mask.numel(), dtype=torch.bool, device=mask.device)])
        return kv_indices, kv_indptr, qo_indptr, mask
