"""What SGLang's TARGET_VERIFY forward and its sampler read from a PARSE round.

`ParseVerifyInput` is the batch's `spec_info` during the one target forward over every
request's window (chain rows c_n, d_1..d_L, then K probe blocks of m rows), all of one
`WindowShape` (SGLang needs the same number of rows N for every request of a batch). Its
tensors are built on the device (`attention.window`): nothing that grows with the context
crosses from the host. `for_capture` is the stand-in SGLang's decode CUDA-graph runner
captures with; with a fixed shape its logits rows are the ones every round replays.

`ChainView` is what `eagle_sample` reads to accept draft tokens exactly as SGLang's own
chain verification does (penalties, logit bias, grammar mask, sampling): it sees only the
L+1 chain rows, as a topk=1 tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind, KVLocPlan
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType

from parse_sglang.attention.layout import indptr_of
from parse_sglang.attention.window import WindowShape, full_mask, window_inputs


class ParseVerifyInput(SpecInput):
    """spec_info of a PARSE TARGET_VERIFY forward.

    custom_mask is in the form the process's attention backend reads in `forward_batch`:
    QLEN_ONLY (N x N per request) on CPU, FULL (N x (P + N) per request) on GPU (Triton reads
    it directly); `generate_attn_arg_prefill` (FlashInfer's entry) always hands out FULL.
    logits_row_index: the rows whose logits PARSE reads, request-major
    (`WindowShape.logits_rows`); scheduler_patches/logits_rows.py prunes the rest before the
    lm_head.
    """

    def __init__(
        self,
        shape: WindowShape,
        batch_size: int,
        *,
        input_ids: Optional[torch.Tensor],
        positions: Optional[torch.Tensor],
        custom_mask: torch.Tensor,
        mask_qlen_only: Optional[torch.Tensor],
        prefix_lens: Optional[torch.Tensor],
        prefix_sum: int,
        device: torch.device,
    ):
        super().__init__(SpecInputType.NGRAM_VERIFY)  # the enum is closed; this type only marks "a verify input"
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
        self.logits_row_index = shape.logits_rows(batch_size, device)
        self.capture_hidden_mode = CaptureHiddenMode.NULL
        self.device = device

    @classmethod
    def for_round(
        cls,
        shape: WindowShape,
        *,
        prefix_lens: torch.Tensor,
        prefix_sum: int,
        chain_tokens: torch.Tensor,
        boundaries: torch.Tensor,
        suffix_ids: torch.Tensor,
        full_mask_form: bool,
    ) -> "ParseVerifyInput":
        """The verify input of one round: prefix_lens [bs] (P), prefix_sum = sum(P) (host int),
        chain_tokens [bs, L+1], boundaries [bs, K] of the window's probes, all on the device."""
        input_ids, positions, mask = window_inputs(shape, prefix_lens, chain_tokens, boundaries, suffix_ids)
        custom_mask = full_mask(mask, shape.rows, prefix_lens, prefix_sum) if full_mask_form else mask
        return cls(
            shape,
            chain_tokens.shape[0],
            input_ids=input_ids,
            positions=positions,
            custom_mask=custom_mask,
            mask_qlen_only=mask,
            prefix_lens=prefix_lens,
            prefix_sum=prefix_sum,
            device=chain_tokens.device,
        )

    @classmethod
    def for_capture(cls, shape: WindowShape, batch_size: int, custom_mask: torch.Tensor) -> "ParseVerifyInput":
        """What SGLang's decode CUDA-graph runner captures a PARSE verify with (its
        `get_spec_info` / `create_dummy_verify_input`): the runner's own all-True mask
        buffer and this shape's logits rows, which the graph bakes in; token ids and
        positions come from the runner's buffers."""
        return cls(
            shape,
            batch_size,
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
        mask is all True, as SGLang's EAGLE pads its own.
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
        if self.mask_qlen_only is not None and mask is self.mask_qlen_only:
            mask = full_mask(mask, window, self.prefix_lens, self.prefix_sum)
        needed = window * paged_kernel_lens_sum + window * window * bs
        if mask.numel() < needed:
            mask = torch.cat([mask, torch.ones(needed - mask.numel(), dtype=torch.bool, device=mask.device)])
        return kv_indices, kv_indptr, qo_indptr, mask


@dataclass
class ChainView:
    """The chain rows of a PARSE window as the topk=1 tree `eagle_sample` verifies.

    draft_token: [bs * (L+1)] c_n, d_1..d_L per request; node j's only child is j + 1.
    """

    draft_token: torch.Tensor
    draft_token_num: int
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    positions: Optional[torch.Tensor] = None
    custom_mask: Optional[torch.Tensor] = None
    draft_probs: Optional[torch.Tensor] = None
    tree_topk: int = 1

    @property
    def max_tree_depth(self) -> int:
        return self.draft_token_num

    @classmethod
    def of(cls, chain_tokens: torch.Tensor) -> "ChainView":
        """chain_tokens: [bs, L+1] (c_n, d_1..d_L)."""
        bs, width = chain_tokens.shape
        device = chain_tokens.device
        next_token = torch.arange(1, width + 1, dtype=torch.int64, device=device)
        next_token[-1] = -1
        return cls(
            draft_token=chain_tokens.reshape(-1),
            draft_token_num=width,
            retrieve_index=torch.arange(bs * width, dtype=torch.int64, device=device).view(bs, width),
            retrieve_next_token=next_token.repeat(bs, 1),
            retrieve_next_sibling=torch.full((bs, width), -1, dtype=torch.int64, device=device),
        )
