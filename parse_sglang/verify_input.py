"""What SGLang's TARGET_VERIFY forward and its sampler read from a PARSE round.

`ParseVerifyInput` is the batch's `spec_info` during the one target forward over every
request's window (chain rows c_n, d_1..d_L, then K probe blocks of m rows). SGLang needs
the same number of rows N for every request of the batch (triton's qo_indptr, the KV
read extent, the eager buffers), which the worker guarantees by giving every request
the same number of probes.

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

from parse_sglang.attention.layout import VerifyLayout, indptr_of


class ParseVerifyInput(SpecInput):
    """spec_info of a PARSE TARGET_VERIFY forward, built from the batch's VerifyLayout.

    custom_mask is in the form the process's attention backend reads in `forward_batch`
    (QLEN_ONLY, N x N per request, on CPU; FULL, N x (P + N), on GPU), while
    `generate_attn_arg_prefill` (FlashInfer's entry) always hands out the FULL form.
    logits_row_index: the rows whose logits PARSE reads (all chain rows, then each probe's
    last row); scheduler_patches/logits_rows.py prunes the rest before the lm_head.
    """

    def __init__(self, layout: VerifyLayout, full_mask: bool, device: torch.device):
        super().__init__(SpecInputType.NGRAM_VERIFY)  # the enum is closed; this type only marks "a verify input"
        window = int(layout.window_lens[0])
        if not bool((layout.window_lens == window).all()):
            raise ValueError(
                f"layout.window_lens={layout.window_lens.tolist()}: SGLang's TARGET_VERIFY needs one "
                "window length for the whole batch"
            )
        self.draft_token_num = window
        self.num_tokens_per_req = window
        self.num_tokens_for_logprob_per_req = window
        self.input_ids = layout.input_ids.to(device)
        self.positions = layout.positions.to(device)
        self.mask_full = layout.mask_full.to(device)
        self.custom_mask = self.mask_full if full_mask else layout.mask_qlen_only.to(device)
        self.logits_row_index = torch.cat([layout.chain_rows, layout.probe_rows]).to(device)
        self.capture_hidden_mode = CaptureHiddenMode.NULL
        self.device = device

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
        )
        return kv_indices, kv_indptr, qo_indptr, self.mask_full


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
